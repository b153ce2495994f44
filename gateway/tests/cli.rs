//! The `toolrun` binary as a user runs it: output and exit codes.

use std::process::{Command, Output, Stdio};

use serde_json::Value;
use toolrun::serve::{Running, ServeArgs, start};

async fn gateway() -> Running {
    start(ServeArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        ..ServeArgs::default()
    })
    .await
    .expect("gateway starts (run the tests as root)")
}

async fn toolrun(s: &Running, args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolrun"));
    cmd.args(args)
        .env("TOOLRUN_ADDR", format!("http://{}", s.grpc_addr))
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let stdin = stdin.map(str::to_string);
    tokio::task::spawn_blocking(move || {
        let mut child = cmd.spawn().unwrap();
        if let Some(text) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
        }
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_prints_json_and_exit_codes_tell_outcomes_apart() {
    let s = gateway().await;
    let out = toolrun(
        &s,
        &["call", "calculator", r#"{"expression":"2**10"}"#],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["output"]["formatted"], "1024");

    let out = toolrun(&s, &["call", "calculator", r#"{"expression":"1/0"}"#], None).await;
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["code"], "DIVISION_BY_ZERO");

    let out = toolrun(&s, &["call", "--addr", "http://127.0.0.1:1", "echo"], None).await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("cannot connect"));

    let out = toolrun(&s, &["call"], None).await;
    assert_eq!(out.status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_in_every_format() {
    let s = gateway().await;
    let out = toolrun(&s, &["tools"], None).await;
    assert_eq!(out.status.code(), Some(0));
    let table = text(&out.stdout);
    let ids = [
        "calculator",
        "echo",
        "hash",
        "web_fetch",
        "read_file",
        "write_file",
        "list_directory",
        "delete_file",
        "move_file",
        "glob",
        "grep",
        "edit",
        "run_code",
        "code_executor",
        "shell",
    ];
    for id in ids {
        assert!(table.contains(id), "{table}");
    }
    // web_search has no provider here: listed only with --all, disabled with the reason.
    assert!(!table.contains("web_search"), "{table}");
    let out = toolrun(&s, &["tools", "--all"], None).await;
    let all = String::from_utf8_lossy(&out.stdout);
    let line = all
        .lines()
        .find(|l| l.starts_with("web_search"))
        .unwrap_or_default();
    assert!(line.contains("DISABLED: no search provider"), "{all}");
    for (format, name_ptr) in [
        ("json", "/id"),
        ("openai", "/function/name"),
        ("anthropic", "/name"),
        ("mcp", "/name"),
    ] {
        let out = toolrun(&s, &["tools", "--format", format], None).await;
        assert_eq!(out.status.code(), Some(0));
        let v: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v.len(), ids.len(), "{format}");
        for id in ids {
            assert!(
                v.iter()
                    .any(|t| t.pointer(name_ptr) == Some(&Value::from(id))),
                "{format}: {id}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_streams_program_output_and_reports_failure() {
    let s = gateway().await;
    let out = toolrun(
        &s,
        &["run", "-l", "bash", "-c", "echo hi; echo oops >&2; exit 3"],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout), "hi\n");
    let err = text(&out.stderr);
    assert!(
        err.contains("oops") && err.contains("EXECUTION_ERROR"),
        "{err}"
    );

    // The program from stdin.
    let out = toolrun(&s, &["run", "--language", "python"], Some("print(6*7)\n")).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "42\n");

    // From a file, with args and env.
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        f.path(),
        "console.log(process.argv.slice(2).join(','), process.env.X)",
    )
    .unwrap();
    let path = f.path().to_str().unwrap();
    let out = toolrun(
        &s,
        &[
            "run",
            "-l",
            "javascript",
            path,
            "--arg",
            "a",
            "--arg",
            "b",
            "--env",
            "X=y",
        ],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "a,b y\n");
}

/// The approval walk-through of the README: a session, a call that waits, `approvals`,
/// `deny` (exit 1, APPROVAL_DENIED), `approve --args` (the modified arguments run), and
/// `session list` / `close`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_and_approvals_from_the_command_line() {
    let s = gateway().await;
    let out = toolrun(&s, &["session", "create"], None).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    assert!(id.starts_with("s-") && id.len() == 34, "{id:?}");
    let read_notes = [
        "call",
        "--session",
        &id,
        "read_file",
        r#"{"path":"notes.txt"}"#,
    ];

    let out = toolrun(
        &s,
        &[
            "call",
            "--session",
            &id,
            "write_file",
            r#"{"path":"notes.txt","content":"alpha\nbeta\n"}"#,
        ],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));

    // delete_file asks (mode safe): the call waits while we deny it.
    let addr = format!("http://{}", s.grpc_addr);
    let waiting = {
        let (addr, id) = (addr.clone(), id.clone());
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_toolrun"))
                .args(["call", "--addr", &addr, "--session", &id])
                .args(["delete_file", r#"{"path":"notes.txt"}"#])
                .output()
                .unwrap()
        })
    };
    let approval = wait_for_approval(&s, &id).await;
    assert_eq!(approval["tool"], "delete_file");
    assert_eq!(approval["kind"], "destructive");
    let approval_id = approval["approval_id"].as_str().unwrap().to_string();
    let out = toolrun(&s, &["deny", &approval_id, "--message", "keep it"], None).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = waiting.await.unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains(&approval_id),
        "{}",
        text(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["code"], "APPROVAL_DENIED");
    assert!(v["error"]["message"].as_str().unwrap().contains("keep it"));
    // One decision per approval.
    let out = toolrun(&s, &["approve", &approval_id], None).await;
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stderr).contains("no pending approval"),
        "{}",
        text(&out.stderr)
    );

    // edit asks too; approved with other arguments, those run.
    let waiting = {
        let (addr, id) = (addr.clone(), id.clone());
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_toolrun"))
                .args(["call", "--addr", &addr, "--session", &id, "edit"])
                .arg(r#"{"path":"notes.txt","old_string":"beta","new_string":"gamma"}"#)
                .output()
                .unwrap()
        })
    };
    let approval = wait_for_approval(&s, &id).await;
    assert!(
        approval["reason"].as_str().unwrap().contains("+gamma"),
        "{approval}"
    );
    let approval_id = approval["approval_id"].as_str().unwrap().to_string();
    let out = toolrun(
        &s,
        &[
            "approve",
            &approval_id,
            "--args",
            r#"{"path":"notes.txt","old_string":"beta","new_string":"delta"}"#,
        ],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = waiting.await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["output"]["approval"]["argumentsModified"], true);
    assert_eq!(v["output"]["approval"]["arguments"]["new_string"], "delta");
    let out = toolrun(&s, &read_notes, None).await;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["output"]["content"], "     1\talpha\n     2\tdelta\n");

    let out = toolrun(&s, &["session", "list"], None).await;
    assert!(text(&out.stdout).contains(&id));
    let out = toolrun(&s, &["session", "close", &id], None).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = toolrun(&s, &read_notes, None).await;
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["code"], "SESSION_NOT_FOUND");
}

/// The first approval pending in `session`, polled with `toolrun approvals --json`.
async fn wait_for_approval(s: &Running, session: &str) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let out = toolrun(s, &["approvals", "--session", session, "--json"], None).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        if let Some(line) = text(&out.stdout).lines().next() {
            return serde_json::from_str(line).unwrap();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no approval appeared within 20 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
