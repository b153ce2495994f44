//! The agent's file ops: each a round trip through the agent, compared with the same call on
//! the file-access core directly (one implementation), and the core's typed errors on the
//! wire, hostile paths included.

mod agent_support;

use agent_support::*;
use serde_json::{Value, json};
use toolrun_runner::agent::proto::FileOpKind as K;
use toolrun_workspace::{Workspace, WorkspaceLimits};

fn call(a: &mut Agent, id: &str, kind: K, args: Value) -> toolrun_runner::agent::proto::Response {
    a.call(&file_op(id, kind, args))
}

#[test]
fn every_file_op_round_trips() {
    let ws_dir = temp_dir("files");
    let mut a = Agent::spawn(&["--workspace", ws_dir.to_str().unwrap()]);

    let w = ok(&call(
        &mut a,
        "w1",
        K::WriteFile,
        json!({"path": "src/main.py", "content": "print('hello')\nx = 1\n", "createDirs": true}),
    ));
    assert_eq!(
        (w["path"].as_str(), w["created"].as_bool()),
        (Some("src/main.py"), Some(true))
    );
    assert_eq!(
        std::fs::read_to_string(ws_dir.join("src/main.py")).unwrap(),
        "print('hello')\nx = 1\n"
    );

    let exists = ok(&call(&mut a, "e1", K::Exists, args_path("src/main.py")));
    assert_eq!(exists, json!({"exists": true}));
    let exists = ok(&call(&mut a, "e2", K::Exists, args_path("nope/x")));
    assert_eq!(exists, json!({"exists": false}));

    let preview = ok(&call(
        &mut a,
        "p1",
        K::PreviewWrite,
        json!({"path": "src/main.py", "content": "print('bye')\n"}),
    ));
    assert!(
        preview["diff"].as_str().unwrap().contains("+print('bye')"),
        "{preview}"
    );
    let preview = ok(&call(
        &mut a,
        "p2",
        K::PreviewEdit,
        json!({"path": "src/main.py", "old_string": "x = 1", "new_string": "x = 2"}),
    ));
    assert!(
        preview["diff"].as_str().unwrap().contains("+x = 2"),
        "{preview}"
    );
    assert_eq!(
        std::fs::read_to_string(ws_dir.join("src/main.py")).unwrap(),
        "print('hello')\nx = 1\n",
        "previews change nothing"
    );

    let e = ok(&call(
        &mut a,
        "ed",
        K::Edit,
        json!({"path": "src/main.py", "old_string": "x = 1", "new_string": "x = 2"}),
    ));
    assert_eq!(e["replacements"], 1);
    assert_eq!(
        std::fs::read_to_string(ws_dir.join("src/main.py")).unwrap(),
        "print('hello')\nx = 2\n"
    );

    let d = ok(&call(
        &mut a,
        "rd",
        K::ResolveDir,
        args_path("/workspace/src"),
    ));
    assert_eq!(d, json!({"path": "src"}));

    let m = ok(&call(
        &mut a,
        "mv",
        K::MoveFile,
        json!({"from": "src/main.py", "to": "app.py"}),
    ));
    assert_eq!(m["to"], "app.py");
    assert!(ws_dir.join("app.py").exists() && !ws_dir.join("src/main.py").exists());

    // Reads and searches: the agent's answer is the core's answer.
    let core = Workspace::open(&ws_dir, WorkspaceLimits::default()).unwrap();
    let cases: Vec<(K, Value, Value)> = vec![
        (
            K::ReadFile,
            json!({"path": "app.py"}),
            serde_json::to_value(
                core.read_file(&serde_json::from_value(json!({"path": "app.py"})).unwrap())
                    .unwrap(),
            )
            .unwrap(),
        ),
        (
            K::ListDirectory,
            json!({"path": ".", "recursive": true}),
            serde_json::to_value(
                core.list_directory(
                    &serde_json::from_value(json!({"path": ".", "recursive": true})).unwrap(),
                )
                .unwrap(),
            )
            .unwrap(),
        ),
        (
            K::Glob,
            json!({"pattern": "**/*.py"}),
            serde_json::to_value(
                core.glob(&serde_json::from_value(json!({"pattern": "**/*.py"})).unwrap())
                    .unwrap(),
            )
            .unwrap(),
        ),
        (
            K::Grep,
            json!({"pattern": "x = \\d"}),
            serde_json::to_value(
                core.grep(&serde_json::from_value(json!({"pattern": "x = \\d"})).unwrap())
                    .unwrap(),
            )
            .unwrap(),
        ),
    ];
    for (i, (kind, args, want)) in cases.into_iter().enumerate() {
        let got = ok(&call(&mut a, &format!("c{i}"), kind, args));
        assert_eq!(got, want, "{kind:?}");
    }
    let r = ok(&call(&mut a, "r1", K::ReadFile, json!({"path": "app.py"})));
    assert!(r["content"].as_str().unwrap().contains("print('hello')"));
    let g = ok(&call(&mut a, "g1", K::Grep, json!({"pattern": "x = \\d"})));
    assert_eq!(g["matches"][0]["path"], "app.py");

    // Binary content both ways.
    ok(&call(
        &mut a,
        "wb",
        K::WriteFile,
        json!({"path": "b.bin", "content": "AAEC/w==", "encoding": "base64"}),
    ));
    assert_eq!(
        std::fs::read(ws_dir.join("b.bin")).unwrap(),
        vec![0, 1, 2, 255]
    );
    let rb = ok(&call(
        &mut a,
        "rb",
        K::ReadFile,
        json!({"path": "b.bin", "encoding": "base64"}),
    ));
    assert_eq!(rb["content"], "AAEC/w==");

    let del = ok(&call(
        &mut a,
        "dl",
        K::DeleteFile,
        json!({"path": "src", "recursive": true}),
    ));
    assert!(del["count"].as_u64().unwrap() >= 1, "{del}");
    assert!(!ws_dir.join("src").exists());
}

#[test]
fn typed_errors_cross_the_wire() {
    let base = temp_dir("file-errors");
    let ws_dir = base.join("ws");
    std::fs::create_dir_all(ws_dir.join("dir")).unwrap();
    std::fs::write(base.join("secret.txt"), "outside").unwrap();
    std::fs::write(ws_dir.join("twice.txt"), "a a").unwrap();
    std::os::unix::fs::symlink(base.join("secret.txt"), ws_dir.join("link_out")).unwrap();
    std::os::unix::fs::symlink("../secret.txt", ws_dir.join("rel_out")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", ws_dir.join("passwd")).unwrap();
    let mut a = Agent::spawn(&["--workspace", ws_dir.to_str().unwrap()]);
    let cases: Vec<(K, Value, &str)> = vec![
        (
            K::ReadFile,
            json!({"path": "missing.txt"}),
            "FILE_NOT_FOUND",
        ),
        (
            K::ReadFile,
            json!({"path": "../secret.txt"}),
            "INVALID_PATH",
        ),
        (K::ReadFile, json!({"path": "/etc/passwd"}), "INVALID_PATH"),
        (K::ReadFile, json!({"path": "link_out"}), "INVALID_PATH"),
        (K::ReadFile, json!({"path": "rel_out"}), "INVALID_PATH"),
        (K::ReadFile, json!({"path": "passwd"}), "INVALID_PATH"),
        (
            K::WriteFile,
            json!({"path": "../escape.txt", "content": "x"}),
            "INVALID_PATH",
        ),
        (
            K::WriteFile,
            json!({"path": "no/such/dir.txt", "content": "x"}),
            "FILE_NOT_FOUND",
        ),
        (K::ReadFile, json!({"path": "dir"}), "IS_A_DIRECTORY"),
        (
            K::ListDirectory,
            json!({"path": "twice.txt"}),
            "NOT_A_DIRECTORY",
        ),
        (
            K::Edit,
            json!({"path": "twice.txt", "old_string": "zzz", "new_string": "b"}),
            "NO_MATCH",
        ),
        (
            K::Edit,
            json!({"path": "twice.txt", "old_string": "a", "new_string": "b"}),
            "AMBIGUOUS_MATCH",
        ),
        (
            K::MoveFile,
            json!({"from": "twice.txt", "to": "dir"}),
            "ALREADY_EXISTS",
        ),
        (
            K::ResolveDir,
            json!({"path": "twice.txt"}),
            "NOT_A_DIRECTORY",
        ),
        (K::Grep, json!({"pattern": "("}), "INVALID_ARGUMENTS"),
        (
            K::ReadFile,
            json!({"path": "twice.txt", "bogus": 1}),
            "INVALID_ARGUMENTS",
        ),
        (K::Exists, json!({}), "INVALID_ARGUMENTS"),
    ];
    for (i, (kind, args, code)) in cases.iter().enumerate() {
        let r = call(&mut a, &format!("e{i}"), *kind, args.clone());
        let (got, msg) = error(&r);
        assert_eq!(got, *code, "{kind:?} {args}: {msg}");
        assert!(!msg.is_empty());
    }
    // Details survive the wire (an ambiguous edit lists where).
    let r = call(
        &mut a,
        "det",
        K::Edit,
        json!({"path": "twice.txt", "old_string": "a", "new_string": "b"}),
    );
    let toolrun_runner::agent::proto::Body::Error(e) = &r.body else {
        panic!()
    };
    assert!(e.details.is_some(), "{e:?}");
    // Nothing outside was touched or created.
    assert_eq!(
        std::fs::read_to_string(base.join("secret.txt")).unwrap(),
        "outside"
    );
    assert!(!base.join("escape.txt").exists());
}

#[test]
fn without_a_workspace_file_ops_are_refused() {
    let mut a = Agent::spawn(&[]);
    let r = call(&mut a, "x", K::ReadFile, json!({"path": "a"}));
    assert_eq!(error(&r).0, "NO_WORKSPACE");
    assert_eq!(a.status("s")["workspace"], Value::Null);
}

#[test]
fn usage_reports_the_walk_and_the_configured_limit() {
    let ws_dir = temp_dir("usage");
    let limit: u64 = 64 << 20;
    let mut a = Agent::spawn(&[
        "--workspace",
        ws_dir.to_str().unwrap(),
        "--workspace-limit-bytes",
        &limit.to_string(),
    ]);
    let before = ok(&call(&mut a, "u1", K::Usage, json!({})));
    assert_eq!(before["bytesLimit"], limit, "{before}");
    assert_eq!(before["filesUsed"], 1, "{before}");
    assert_eq!(before["truncated"], false, "{before}");
    // A program's write (not a file op) shows: 1 MiB more.
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 251) as u8).collect();
    std::fs::write(ws_dir.join("big.bin"), data).unwrap();
    let after = ok(&call(&mut a, "u2", K::Usage, json!({})));
    let grown = after["bytesUsed"].as_u64().unwrap() - before["bytesUsed"].as_u64().unwrap();
    assert!(grown >= 1 << 20, "{before} then {after}");
    assert_eq!(after["filesUsed"], 2, "{after}");
    // The answer is the core's, which is unit tested on hostile trees.
    let core = Workspace::open(
        &ws_dir,
        WorkspaceLimits {
            size_bytes: Some(limit),
            ..WorkspaceLimits::default()
        },
    )
    .unwrap();
    assert_eq!(after, serde_json::to_value(core.usage().unwrap()).unwrap());
    // Arguments are an empty object: anything else is refused, as for every op.
    let r = call(&mut a, "u3", K::Usage, json!({"path": "."}));
    assert_eq!(error(&r).0, "INVALID_ARGUMENTS");

    // Control: without the flag, the filesystem's size (the node's disk on an emptyDir).
    let mut plain = Agent::spawn(&["--workspace", ws_dir.to_str().unwrap()]);
    let u = ok(&call(&mut plain, "u1", K::Usage, json!({})));
    let vfs = rustix::fs::statvfs(&ws_dir).unwrap();
    assert_eq!(u["bytesLimit"], vfs.f_blocks * vfs.f_frsize, "{u}");
    assert_ne!(u["bytesLimit"], limit);
}
