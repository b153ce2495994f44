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
    for id in ["calculator", "echo", "hash", "run_code", "code_executor"] {
        assert!(table.contains(id), "{table}");
    }
    for (format, name_ptr) in [
        ("json", "/id"),
        ("openai", "/function/name"),
        ("anthropic", "/name"),
        ("mcp", "/name"),
    ] {
        let out = toolrun(&s, &["tools", "--format", format], None).await;
        assert_eq!(out.status.code(), Some(0));
        let v: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v.len(), 5, "{format}");
        assert!(
            v.iter()
                .any(|t| t.pointer(name_ptr) == Some(&Value::from("run_code"))),
            "{format}"
        );
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
