//! Authentication and tenants against real `toolrun serve` processes (SECURITY-CASES 50-52):
//! every front door (gRPC, MCP, the HTTP provider endpoint) refuses a missing, wrong or
//! revoked key with the same typed answer; tenants do not see, call, close or approve each
//! other's sessions; allowed tools, capabilities (seed 003) and rate limits hold per tenant;
//! a non-loopback listener needs keys or `--insecure-no-auth`. Each refusal has a control
//! that the same request succeeds with the right key or tenant.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use toolrun::auth::UNAUTHENTICATED_MESSAGE;
use toolrun::cli::{Client, connect};
use toolrun_proto::v1 as pb;

const BIN: &str = env!("CARGO_BIN_EXE_toolrun");

/// Tenants of the main gateway: plain ones, one limited to the calculator, one that may only
/// read files, one with a tight rate and one session.
const CONFIG: &str = "\
sessions:
  workspace_size_mb: 64
  workspace_max_files: 16384
  approval_timeout_seconds: 60
auth:
  reload_interval_seconds: 1
  tenants:
    team-a: {}
    team-b: {}
    calc-only:
      tools: [calculator]
    reader:
      capabilities: [filesystem.read]
    slow:
      limits: {calls_per_minute: 6, burst: 3, sessions: 1}
";

/// A `toolrun serve` child process, stopped with SIGTERM on drop.
struct Gw {
    child: std::process::Child,
    grpc: SocketAddr,
    mcp: Option<SocketAddr>,
    admin: SocketAddr,
    log: PathBuf,
    dir: tempfile::TempDir,
}

impl Gw {
    /// Starts `toolrun serve` with `args` after the defaults (loopback, ephemeral ports,
    /// no sandbox, a state dir and `config` in a temporary directory); `Err` holds the log
    /// when it exits instead of serving.
    fn start(config: &str, args: &[&str]) -> Result<Gw, (Option<i32>, String)> {
        let dir = tempfile::tempdir().unwrap();
        Self::start_in(dir, config, args)
    }

    fn start_in(
        dir: tempfile::TempDir,
        config: &str,
        args: &[&str],
    ) -> Result<Gw, (Option<i32>, String)> {
        Self::start_with(dir, config, args, false)
    }

    /// As [`Gw::start_in`]; `sandbox`: with the local sandbox (run_code, shell).
    fn start_with(
        dir: tempfile::TempDir,
        config: &str,
        args: &[&str],
        sandbox: bool,
    ) -> Result<Gw, (Option<i32>, String)> {
        let cfg = dir.path().join("toolrun.yaml");
        std::fs::write(&cfg, config).unwrap();
        let log = dir.path().join("gateway.log");
        let mut full: Vec<String> = ["--log-format", "json", "serve"].map(String::from).to_vec();
        if !sandbox {
            full.push("--no-sandbox".into());
        }
        // Loopback and ephemeral ports unless `args` says otherwise.
        for (flag, value) in [
            ("--listen", "127.0.0.1:0"),
            ("--admin-listen", "127.0.0.1:0"),
            ("--mcp-listen", "127.0.0.1:0"),
        ] {
            if !args.contains(&flag) {
                full.extend([flag.to_string(), value.to_string()]);
            }
        }
        full.push("--state-dir".into());
        full.push(dir.path().join("state").display().to_string());
        full.push("--config".into());
        full.push(cfg.display().to_string());
        full.extend(args.iter().map(|s| s.to_string()));
        let mut child = Command::new(BIN)
            .args(&full)
            .env_remove("TOOLRUN_API_KEYS")
            .env_remove("TOOLRUN_INSECURE_NO_AUTH")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(line) = text.lines().find(|l| l.contains("\"toolrun serving\"")) {
                let v: Value = serde_json::from_str(line).unwrap();
                let addr = |k: &str| -> Option<SocketAddr> {
                    let s = v[k].as_str()?;
                    let s = s.trim_start_matches("Some(").trim_end_matches(')');
                    s.parse().ok()
                };
                return Ok(Gw {
                    grpc: addr("grpc").expect("grpc address"),
                    admin: addr("admin").expect("admin address"),
                    mcp: addr("mcp"),
                    child,
                    log,
                    dir,
                });
            }
            if let Some(status) = child.try_wait().unwrap() {
                return Err((status.code(), text));
            }
            assert!(Instant::now() < deadline, "gateway did not start:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    async fn client(&self, key: Option<&str>) -> Client {
        connect(&self.url(), key).await.unwrap()
    }

    fn keys(&self) -> PathBuf {
        self.dir.path().join("keys.yaml")
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (up to 10 s: the log is written by a background thread) for a log line that
    /// contains every one of `parts`; panics with the log otherwise.
    async fn wait_for_line(&self, parts: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log_text();
            if log.lines().any(|l| parts.iter().all(|p| l.contains(p))) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no log line with {parts:?}:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Gw {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `toolrun keys create` as a user runs it: prints the key once.
fn create_key(keys: &Path, tenant: &str, name: &str) -> String {
    let out = Command::new(BIN)
        .args([
            "keys", "create", "--tenant", tenant, "--name", name, "--file",
        ])
        .arg(keys)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(key.starts_with("trk_"), "{key}");
    key
}

/// A gateway with keys for every tenant of [`CONFIG`]; returns it and the keys by tenant.
fn gateway_with_tenants() -> (Gw, std::collections::HashMap<&'static str, String>) {
    let dir = tempfile::tempdir().unwrap();
    let keys_file = dir.path().join("keys.yaml");
    let keys = ["team-a", "team-b", "calc-only", "reader", "slow"]
        .into_iter()
        .map(|t| (t, create_key(&keys_file, t, &format!("{t}-key"))))
        .collect();
    let gw = Gw::start_in(dir, CONFIG, &["--api-keys", keys_file.to_str().unwrap()])
        .unwrap_or_else(|(code, log)| panic!("gateway exited {code:?}:\n{log}"));
    (gw, keys)
}

fn call_req(tool: &str, args: Value, session: &str) -> pb::CallToolRequest {
    pb::CallToolRequest {
        call_id: String::new(),
        tool: tool.into(),
        arguments_json: args.to_string(),
        timeout_ms: 0,
        session_id: session.into(),
    }
}

async fn call(c: &mut Client, tool: &str, args: Value, session: &str) -> pb::ToolResult {
    c.call_tool(call_req(tool, args, session))
        .await
        .unwrap_or_else(|s| panic!("{tool}: {s:?}"))
        .into_inner()
        .result
        .unwrap()
}

fn code(r: &pb::ToolResult) -> String {
    r.error
        .as_ref()
        .map(|e| toolrun::grpc::error_code_name(e.code))
        .unwrap_or_else(|| "OK".into())
}

async fn create_session(c: &mut Client, mode: pb::ApprovalMode) -> Result<String, tonic::Status> {
    Ok(c.create_session(pb::CreateSessionRequest {
        session_id: String::new(),
        approval_mode: mode as i32,
        idle_timeout_seconds: 0,
    })
    .await?
    .into_inner()
    .session_id)
}

/// One HTTP/1.1 exchange on the MCP listener: status, head, body.
async fn http(
    addr: SocketAddr,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> (u16, String, String) {
    let auth = key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-11-25\r\n\
         {auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut buf))
        .await
        .expect("an answer within 30 s")
        .unwrap();
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap();
    (status, head.to_string(), body.to_string())
}

fn mcp_call(tool: &str, args: Value) -> String {
    json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
           "params": {"name": tool, "arguments": args}})
    .to_string()
}

const MCP_LIST: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;

const OPENAI_MESSAGE: &str = r#"{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"calculator","arguments":"{\"expression\":\"6*7\"}"}}]}"#;

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

// ---------------------------------------------------------------- tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_wrong_and_revoked_keys_are_refused_on_every_front_door() {
    let (gw, keys) = gateway_with_tenants();
    let (a, b) = (keys["team-a"].as_str(), keys["team-b"].as_str());
    let calc = || call_req("calculator", json!({"expression": "6*7"}), "");

    // gRPC: no key and a wrong key get the same UNAUTHENTICATED; the right key works.
    let wrong = format!("{a}x");
    for key in [
        None,
        Some(wrong.as_str()),
        Some("trk_not-a-key-at-all-0000"),
    ] {
        let e = gw.client(key).await.call_tool(calc()).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{key:?}: {e:?}");
        assert_eq!(
            e.message(),
            UNAUTHENTICATED_MESSAGE,
            "nothing says which part failed"
        );
        let e = gw
            .client(key)
            .await
            .list_sessions(pb::ListSessionsRequest {})
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
    }
    let mut ca = gw.client(Some(a)).await;
    let r = call(&mut ca, "calculator", json!({"expression": "6*7"}), "").await;
    assert!(r.ok, "{r:?}");
    assert!(r.output_json.contains("42"), "{r:?}");

    // gRPC health stays open (probes); the admin port serves metrics without a key.
    let channel = tonic::transport::Channel::from_shared(gw.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let health = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(health.status, 1, "SERVING");
    let mut s = tokio::net::TcpStream::connect(gw.admin).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");

    // MCP and the provider endpoint: 401 with a Bearer challenge, JSON-RPC error for MCP.
    let mcp = gw.mcp.unwrap();
    for key in [None, Some(wrong.as_str())] {
        let (status, head, body) = http(
            mcp,
            "/mcp",
            key,
            &mcp_call("calculator", json!({"expression": "1"})),
        )
        .await;
        assert_eq!(status, 401, "{head}\n{body}");
        assert!(
            header(&head, "www-authenticate").is_some_and(|v| v.starts_with("Bearer")),
            "{head}"
        );
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"]["message"], UNAUTHENTICATED_MESSAGE, "{body}");
        let (status, head, body) = http(mcp, "/v1/openai/tool-calls", key, OPENAI_MESSAGE).await;
        assert_eq!(status, 401, "{head}\n{body}");
        assert!(header(&head, "www-authenticate").is_some(), "{head}");
        assert!(body.contains("unauthenticated"), "{body}");
    }
    let (status, _, body) = http(
        mcp,
        "/mcp",
        Some(a),
        &mcp_call("calculator", json!({"expression": "6*7"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["result"]["structuredContent"]["value"], 42.0, "{body}");
    let (status, _, body) = http(mcp, "/v1/openai/tool-calls", Some(a), OPENAI_MESSAGE).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("42"), "{body}");

    // The CLI takes the key from TOOLRUN_API_KEY (or --api-key).
    let cli = |key: Option<&str>| {
        let mut cmd = Command::new(BIN);
        cmd.args(["call", "calculator", r#"{"expression":"2**10"}"#])
            .env("TOOLRUN_ADDR", gw.url())
            .env_remove("TOOLRUN_API_KEY");
        if let Some(k) = key {
            cmd.env("TOOLRUN_API_KEY", k);
        }
        cmd.output().unwrap()
    };
    let out = cli(Some(a));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(None);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("authentication required"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // --api-key works like the environment variable; bench sends the key on gRPC and MCP.
    let out = Command::new(BIN)
        .args(["tools", "--addr", &gw.url(), "--api-key", a])
        .env_remove("TOOLRUN_API_KEY")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("calculator"));
    let bench = |key: Option<&str>| {
        let mut cmd = Command::new(BIN);
        cmd.args(["bench", "--addr", &gw.url(), "--mcp-url"])
            .arg(format!("http://{mcp}/mcp"))
            .args(["--seconds", "0.3", "--concurrency", "1", "--json"])
            .args(["--no-sandbox", "--no-sessions", "--no-interp"])
            .env_remove("TOOLRUN_API_KEY");
        if let Some(k) = key {
            cmd.args(["--api-key", k]);
        }
        cmd.output().unwrap()
    };
    let reports = |out: std::process::Output| -> Vec<Value> {
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let with_key = reports(bench(Some(a)));
    assert!(
        with_key.len() >= 3
            && with_key
                .iter()
                .all(|r| r["failures"] == 0 && r["calls"].as_u64() > Some(0)),
        "{with_key:?}"
    );
    assert!(
        with_key
            .iter()
            .any(|r| r["scenario"].as_str().unwrap().starts_with("mcp")),
        "{with_key:?}"
    );
    // Control: without the key every call of the bench fails.
    let without = reports(bench(None));
    assert!(
        without
            .iter()
            .all(|r| r["failures"].as_u64() > Some(0)
                && r["failures"].as_u64() >= r["calls"].as_u64()),
        "{without:?}"
    );

    // Revoking team-a's key (the CLI rewrites the file) applies without a restart, within
    // the reload interval; team-b's key keeps working.
    let out = Command::new(BIN)
        .args(["keys", "revoke", "--file"])
        .arg(gw.keys())
        .arg("team-a-key")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match gw.client(Some(a)).await.call_tool(calc()).await {
            Err(e) if e.code() == tonic::Code::Unauthenticated => break,
            other => assert!(
                Instant::now() < deadline,
                "revoked key still accepted after 15 s: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, _, _) = http(mcp, "/v1/openai/tool-calls", Some(a), OPENAI_MESSAGE).await;
    assert_eq!(status, 401, "revoked on HTTP too");
    let r = call(
        &mut gw.client(Some(b)).await,
        "calculator",
        json!({"expression": "1+1"}),
        "",
    )
    .await;
    assert!(r.ok, "{r:?}");
    // A new key works at once after the next reload, without a restart.
    let a2 = create_key(&gw.keys(), "team-a", "team-a-second");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if gw.client(Some(&a2)).await.call_tool(calc()).await.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "new key not accepted after 15 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    gw.wait_for_line(&["API keys reloaded"]).await;
    assert!(!gw.log_text().contains(a), "a key never reaches the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_loopback_listener_needs_keys_or_the_insecure_flag() {
    for args in [
        &["--listen", "0.0.0.0:0", "--mcp-listen", "off"][..],
        &["--mcp-listen", "0.0.0.0:0"][..],
    ] {
        let (code, log) = match Gw::start("{}", args) {
            Ok(_) => panic!("{args:?}: served without authentication"),
            Err(e) => e,
        };
        assert_eq!(code, Some(1), "{log}");
        assert!(
            log.contains("refusing to serve without authentication on 0.0.0.0"),
            "{args:?}: {log}"
        );
        assert!(
            log.contains("--insecure-no-auth"),
            "the message names the way out: {log}"
        );
    }
    // Control: with --insecure-no-auth it serves, and says so; calls need no key.
    let gw = Gw::start("{}", &["--listen", "0.0.0.0:0", "--insecure-no-auth"])
        .unwrap_or_else(|(c, log)| panic!("{c:?}: {log}"));
    let url = format!("http://127.0.0.1:{}", gw.grpc.port());
    let mut c = connect(&url, None).await.unwrap();
    assert!(call(&mut c, "echo", json!({"message": "hi"}), "").await.ok);
    gw.wait_for_line(&["WITHOUT authentication"]).await;
    drop(gw);
    // With keys it serves on any address, and a call without a key is refused.
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.yaml");
    let key = create_key(&keys, "team-a", "k");
    let gw = Gw::start_in(
        dir,
        "{}",
        &[
            "--listen",
            "0.0.0.0:0",
            "--api-keys",
            keys.to_str().unwrap(),
        ],
    )
    .unwrap_or_else(|(c, log)| panic!("{c:?}: {log}"));
    let url = format!("http://127.0.0.1:{}", gw.grpc.port());
    let e = connect(&url, None)
        .await
        .unwrap()
        .call_tool(call_req("echo", json!({"message": "hi"}), ""))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    let mut c = connect(&url, Some(&key)).await.unwrap();
    assert!(call(&mut c, "echo", json!({"message": "hi"}), "").await.ok);
    // Loopback without keys: served (the existing tests rely on it).
    let gw = Gw::start("{}", &[]).unwrap_or_else(|(c, log)| panic!("{c:?}: {log}"));
    let mut c = gw.client(None).await;
    assert!(call(&mut c, "echo", json!({"message": "hi"}), "").await.ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_cannot_see_call_close_or_approve_each_others_sessions() {
    let (gw, keys) = gateway_with_tenants();
    let mut a = gw.client(Some(&keys["team-a"])).await;
    let mut b = gw.client(Some(&keys["team-b"])).await;
    // Mode none: every call of A's asks for approval.
    let sa = create_session(&mut a, pb::ApprovalMode::None)
        .await
        .unwrap();
    let mut stream = a
        .stream_tool(call_req(
            "write_file",
            json!({"path": "notes.txt", "content": "from A"}),
            &sa,
        ))
        .await
        .unwrap()
        .into_inner();
    let approval = match stream.message().await.unwrap().unwrap().event {
        Some(pb::tool_event::Event::Approval(ap)) => ap,
        other => panic!("expected the approval first: {other:?}"),
    };

    // B, knowing both ids, learns nothing and changes nothing.
    let e = b
        .get_session(pb::GetSessionRequest {
            session_id: sa.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let listed = b
        .list_sessions(pb::ListSessionsRequest {})
        .await
        .unwrap()
        .into_inner()
        .sessions;
    assert!(listed.iter().all(|s| s.session_id != sa), "{listed:?}");
    let r = call(&mut b, "read_file", json!({"path": "notes.txt"}), &sa).await;
    assert_eq!(code(&r), "SESSION_NOT_FOUND", "{r:?}");
    let pending = b
        .list_approvals(pb::ListApprovalsRequest {
            session_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .approvals;
    assert!(pending.is_empty(), "B sees A's approval: {pending:?}");
    let e = b
        .decide_approval(pb::DecideApprovalRequest {
            approval_id: approval.approval_id.clone(),
            approve: true,
            arguments_json: String::new(),
            message: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let e = b
        .close_session(pb::CloseSessionRequest {
            session_id: sa.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let mut watch = b
        .watch_approvals(pb::WatchApprovalsRequest {
            session_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let seen = tokio::time::timeout(Duration::from_millis(300), watch.message()).await;
    assert!(seen.is_err(), "B's watch shows A's approval: {seen:?}");

    // Control: A sees, approves and closes its own, and the call it approved ran.
    let mine = a
        .list_approvals(pb::ListApprovalsRequest {
            session_id: sa.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .approvals;
    assert_eq!(mine.len(), 1, "{mine:?}");
    a.decide_approval(pb::DecideApprovalRequest {
        approval_id: approval.approval_id.clone(),
        approve: true,
        arguments_json: String::new(),
        message: String::new(),
    })
    .await
    .unwrap();
    let result = loop {
        match stream.message().await.unwrap().unwrap().event {
            Some(pb::tool_event::Event::Result(r)) => break r,
            _ => continue,
        }
    };
    assert!(result.ok, "{result:?}");
    a.get_session(pb::GetSessionRequest {
        session_id: sa.clone(),
    })
    .await
    .unwrap();
    let listed = a
        .list_sessions(pb::ListSessionsRequest {})
        .await
        .unwrap()
        .into_inner()
        .sessions;
    assert!(listed.iter().any(|s| s.session_id == sa), "{listed:?}");
    // B's own session with the same file name is its own.
    let sb = create_session(&mut b, pb::ApprovalMode::All).await.unwrap();
    let r = call(&mut b, "read_file", json!({"path": "notes.txt"}), &sb).await;
    assert_eq!(code(&r), "FILE_NOT_FOUND", "{r:?}");
    a.close_session(pb::CloseSessionRequest {
        session_id: sa.clone(),
    })
    .await
    .unwrap();
    // The audit events name the tenant.
    gw.wait_for_line(&[
        "toolrun::audit",
        "\"tenant\":\"team-b\"",
        "SESSION_NOT_FOUND",
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_tools_and_capabilities_are_checked_before_anything_runs() {
    let (gw, keys) = gateway_with_tenants();
    // calc-only lists and calls the calculator only, on every front door.
    let mut calc = gw.client(Some(&keys["calc-only"])).await;
    let tools = calc
        .list_tools(pb::ListToolsRequest {
            format: 0,
            include_disabled: false,
        })
        .await
        .unwrap()
        .into_inner()
        .tools;
    let ids: Vec<&str> = tools.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["calculator"]);
    let r = call(&mut calc, "echo", json!({"message": "hi"}), "").await;
    assert_eq!(code(&r), "FORBIDDEN", "{r:?}");
    assert!(
        call(&mut calc, "calculator", json!({"expression": "1"}), "")
            .await
            .ok
    );
    let (status, _, body) = http(gw.mcp.unwrap(), "/mcp", Some(&keys["calc-only"]), MCP_LIST).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let names: Vec<&str> = v["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["calculator"], "{body}");
    // Control: team-a lists everything, echo included.
    let all = gw
        .client(Some(&keys["team-a"]))
        .await
        .list_tools(pb::ListToolsRequest {
            format: 0,
            include_disabled: false,
        })
        .await
        .unwrap()
        .into_inner()
        .tools;
    assert!(
        all.len() > 5 && all.iter().any(|t| t.id == "echo"),
        "{all:?}"
    );
    let write = all.iter().find(|t| t.id == "write_file").unwrap();
    assert_eq!(write.required_capabilities, ["filesystem.write"]);

    // reader holds filesystem.read only: write_file is refused before it runs, and audited.
    let mut reader = gw.client(Some(&keys["reader"])).await;
    let s = create_session(&mut reader, pb::ApprovalMode::All)
        .await
        .unwrap();
    let r = call(
        &mut reader,
        "write_file",
        json!({"path": "x.txt", "content": "no"}),
        &s,
    )
    .await;
    assert_eq!(code(&r), "PERMISSION_DENIED", "{r:?}");
    let details: Value = serde_json::from_str(&r.error.as_ref().unwrap().details_json).unwrap();
    assert_eq!(details["capability"], "filesystem.write", "{details}");
    let r = call(&mut reader, "read_file", json!({"path": "x.txt"}), &s).await;
    assert_eq!(code(&r), "FILE_NOT_FOUND", "nothing was written: {r:?}");
    // The refusal is audited.
    gw.wait_for_line(&[
        "toolrun::audit",
        "\"tenant\":\"reader\"",
        "\"tool\":\"write_file\"",
        "PERMISSION_DENIED",
    ])
    .await;
    // Control: team-a holds every capability; the same call writes the file.
    let mut a = gw.client(Some(&keys["team-a"])).await;
    let sa = create_session(&mut a, pb::ApprovalMode::All).await.unwrap();
    let r = call(
        &mut a,
        "write_file",
        json!({"path": "x.txt", "content": "yes"}),
        &sa,
    )
    .await;
    assert!(r.ok, "{r:?}");
    let r = call(&mut a, "read_file", json!({"path": "x.txt"}), &sa).await;
    assert!(r.ok && r.output_json.contains("yes"), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_limits_gets_resource_exhausted_while_others_go_on() {
    let (gw, keys) = gateway_with_tenants();
    let mut slow = gw.client(Some(&keys["slow"])).await;
    let calc = || call_req("calculator", json!({"expression": "1+1"}), "");
    // The burst (3), then RESOURCE_EXHAUSTED with when to retry (6 a minute: ~10 s).
    for i in 0..3 {
        let r = slow.call_tool(calc()).await;
        assert!(r.is_ok(), "call {i} within the burst: {r:?}");
    }
    let e = slow.call_tool(calc()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("calls per minute"), "{e:?}");
    let retry_s: u64 = e
        .metadata()
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let retry_ms: u64 = e
        .metadata()
        .get("retry-after-ms")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=10).contains(&retry_s), "{retry_s}");
    assert!((1..=10_000).contains(&retry_ms), "{retry_ms}");

    // Another tenant is not slowed: its calls all pass meanwhile, on one connection.
    let mut b = gw.client(Some(&keys["team-b"])).await;
    let start = Instant::now();
    for _ in 0..100 {
        assert!(b.call_tool(calc()).await.is_ok());
    }
    println!(
        "team-b: 100 calls in {:?} while slow is limited",
        start.elapsed()
    );

    // The same limiter on MCP (a typed result with retry_after_ms) and HTTP (429).
    let (status, _, body) = http(
        gw.mcp.unwrap(),
        "/mcp",
        Some(&keys["slow"]),
        &mcp_call("calculator", json!({"expression": "1"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let err = &v["result"]["structuredContent"]["error"];
    assert_eq!(err["code"], "RESOURCE_EXHAUSTED", "{body}");
    assert!(
        err["details"]["retry_after_ms"].as_u64().unwrap() > 0,
        "{body}"
    );
    let (status, head, body) = http(
        gw.mcp.unwrap(),
        "/v1/openai/tool-calls",
        Some(&keys["slow"]),
        OPENAI_MESSAGE,
    )
    .await;
    assert_eq!(status, 429, "{head}\n{body}");
    assert!(header(&head, "retry-after").is_some(), "{head}");

    // Sessions: slow may hold one; team-b is not held to that.
    create_session(&mut slow, pb::ApprovalMode::All)
        .await
        .unwrap();
    let e = create_session(&mut slow, pb::ApprovalMode::All)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("limits.sessions"), "{e:?}");
    create_session(&mut b, pb::ApprovalMode::All).await.unwrap();
    create_session(&mut b, pb::ApprovalMode::All).await.unwrap();

    // Control: after the advertised wait, slow's call passes again.
    tokio::time::sleep(Duration::from_millis(retry_ms + 200)).await;
    let r = slow.call_tool(calc()).await;
    assert!(r.is_ok(), "after retry-after: {r:?}");
    gw.wait_for_line(&[
        "toolrun::audit",
        "\"tenant\":\"slow\"",
        "RESOURCE_EXHAUSTED",
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_in_flight_workspace_size_and_approval_mode_are_the_tenants_own() {
    let dir = tempfile::tempdir().unwrap();
    let keys_file = dir.path().join("keys.yaml");
    let one = create_key(&keys_file, "one-run", "one");
    let small = create_key(&keys_file, "small", "small");
    let b = create_key(&keys_file, "team-b", "b");
    let config = "\
sessions:
  workspace_size_mb: 64
  workspace_max_files: 16384
auth:
  tenants:
    one-run: {limits: {runs_in_flight: 1}}
    small: {approval_mode: none, limits: {workspace_size_mb: 32}}
";
    let gw = Gw::start_with(
        dir,
        config,
        &["--api-keys", keys_file.to_str().unwrap()],
        true,
    )
    .unwrap_or_else(|(code, log)| panic!("gateway exited {code:?}:\n{log}"));
    let run = |code: &str| call_req("run_code", json!({"language": "python", "code": code}), "");
    // one-run holds its one slot with a running program...
    let mut one_c = gw.client(Some(&one)).await;
    let mut stream = one_c
        .stream_tool(run(
            "import time\nprint('started', flush=True)\ntime.sleep(4)\nprint('done')",
        ))
        .await
        .unwrap()
        .into_inner();
    match stream.message().await.unwrap().unwrap().event {
        Some(pb::tool_event::Event::Stdout(c)) => {
            assert_eq!(String::from_utf8_lossy(&c.data), "started\n")
        }
        other => panic!("expected the program's first line: {other:?}"),
    }
    // ...so a second run is refused at once, typed, with when to retry.
    let e = gw
        .client(Some(&one))
        .await
        .call_tool(run("print(1)"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("runs_in_flight"), "{e:?}");
    assert!(e.metadata().get("retry-after").is_some(), "{e:?}");
    // Inline tools are not runs: one-run's calculator still answers.
    let r = call(&mut one_c, "calculator", json!({"expression": "2+2"}), "").await;
    assert!(r.ok, "{r:?}");
    // Another tenant's run goes through meanwhile.
    let mut bc = gw.client(Some(&b)).await;
    let r = call(
        &mut bc,
        "run_code",
        json!({"language": "python", "code": "print(6*7)"}),
        "",
    )
    .await;
    assert!(r.ok && r.output_json.contains("42"), "{r:?}");
    // Control: once the first run ends, one-run runs again.
    let result = loop {
        match stream.message().await.unwrap().unwrap().event {
            Some(pb::tool_event::Event::Result(r)) => break r,
            _ => continue,
        }
    };
    assert!(result.ok, "{result:?}");
    let r = call(
        &mut one_c,
        "run_code",
        json!({"language": "python", "code": "print(1)"}),
        "",
    )
    .await;
    assert!(r.ok, "{r:?}");

    // small's sessions: its approval mode by default, and its smaller workspace filesystem.
    let mut sc = gw.client(Some(&small)).await;
    let s = sc
        .create_session(pb::CreateSessionRequest {
            session_id: String::new(),
            approval_mode: 0,
            idle_timeout_seconds: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s.approval_mode, pb::ApprovalMode::None as i32, "{s:?}");
    let sb = bc
        .create_session(pb::CreateSessionRequest {
            session_id: String::new(),
            approval_mode: 0,
            idle_timeout_seconds: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(sb.approval_mode, pb::ApprovalMode::Safe as i32, "{sb:?}");
    // Workspaces are ext4 filesystems here (a sandboxed gateway refuses plain directories):
    // the size is the filesystem's, minus its metadata.
    assert!(
        s.workspace_bytes_limit <= 32 << 20 && s.workspace_bytes_limit > 16 << 20,
        "{s:?}"
    );
    assert!(sb.workspace_bytes_limit > 48 << 20, "{sb:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_file_replays_deterministic_calls_and_reports_a_changed_output() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let gw = Gw::start_in(
        dir,
        "sessions: {workspace_size_mb: 64, workspace_max_files: 16384}\n",
        &["--audit-file", audit.to_str().unwrap()],
    )
    .unwrap_or_else(|(code, log)| panic!("gateway exited {code:?}:\n{log}"));
    let mut c = gw.client(None).await;
    let mut ids = Vec::new();
    for (tool, args) in [
        ("calculator", json!({"expression": "6*7"})),
        ("calculator", json!({"expression": "1/0"})),
        ("echo", json!({"message": "hi"})),
        ("hash", json!({"input": "abc"})),
    ] {
        let r = call(&mut c, tool, args, "").await;
        assert_eq!(r.ok, tool != "calculator" || ids.len() != 1, "{r:?}");
        ids.push(r.call_id.clone());
    }
    let s = create_session(&mut c, pb::ApprovalMode::All).await.unwrap();
    let w = call(
        &mut c,
        "write_file",
        json!({"path": "secret.txt", "content": "the-file-content-stays-out"}),
        &s,
    )
    .await;
    assert!(w.ok, "{w:?}");
    let u = call(&mut c, "no_such_tool", json!({}), "").await;
    assert_eq!(code(&u), "UNKNOWN_TOOL");

    // One line per call, written before the answer; session arguments are not kept.
    let text = std::fs::read_to_string(&audit).unwrap();
    let records: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 6, "{text}");
    assert!(records.iter().all(|r| r["tenant"] == "anonymous"), "{text}");
    assert_eq!(records[0]["verdict"], "OK");
    assert_eq!(records[0]["determinism"], "deterministic");
    assert_eq!(records[0]["arguments"], json!({"expression": "6*7"}));
    assert_eq!(records[1]["verdict"], "DIVISION_BY_ZERO");
    assert_eq!(records[4]["session_id"], s.as_str());
    assert!(records[4].get("arguments").is_none(), "{}", records[4]);
    assert!(!text.contains("the-file-content-stays-out"), "{text}");

    let replay = |file: &Path| {
        let out = Command::new(BIN).arg("replay").arg(file).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (code_ok, out) = replay(&audit);
    assert_eq!(code_ok, Some(0), "{out}");
    for id in &ids {
        assert!(out.contains(&format!("SAME     {id}")), "{id}: {out}");
    }
    assert!(out.contains("SKIPPED") && out.contains("session"), "{out}");
    assert!(out.contains("no_such_tool"), "{out}");
    assert!(
        out.contains("4 replayed (4 same, 0 differ), 2 listed"),
        "{out}"
    );

    // A record whose output hash no longer matches what the tool computes is reported.
    let tampered = audit.with_extension("tampered.jsonl");
    let recorded_hash = records[0]["output_hash"].as_str().unwrap();
    std::fs::write(&tampered, text.replacen(recorded_hash, &"0".repeat(64), 1)).unwrap();
    let (code_bad, out) = replay(&tampered);
    assert_eq!(code_bad, Some(1), "{out}");
    assert!(
        out.contains(&format!("DIFFERS  {} calculator", ids[0])) && out.contains(recorded_hash),
        "{out}"
    );
    assert!(out.contains("4 replayed (3 same, 1 differ)"), "{out}");
}
