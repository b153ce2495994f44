//! The MCP endpoint end to end: a real gateway (local sandbox, sessions; run as root) serving
//! `/mcp`, driven by the official Python `mcp` client (gateway/tests/mcp/client.py, run with
//! the interpreter tests/run installs it into) and by raw HTTP for the wire-level refusals.
//! SECURITY-CASES.md 53 (foreign Host/Origin) and 54 (oversized, malformed, batched bodies).

mod raw_http;
mod sandbox_common;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sandbox_common::ensure_runner_built;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use toolrun::serve::{Listen, Running, ServeArgs, start};
use toolrun_proto::v1 as pb;
use toolrun_proto::v1::tool_service_client::ToolServiceClient;

type Client = ToolServiceClient<tonic::transport::Channel>;

/// The interpreter with the pinned `mcp` package (tests/run makes it).
const DEFAULT_PYTHON: &str = "/opt/toolrun-test-venv/bin/python";
/// Bound of one client script.
const SCRIPT_BOUND: Duration = Duration::from_secs(120);

fn python() -> PathBuf {
    let p = PathBuf::from(
        std::env::var("TOOLRUN_TEST_PYTHON").unwrap_or_else(|_| DEFAULT_PYTHON.into()),
    );
    assert!(
        p.is_file(),
        "{} is missing: run tests/run, or `python3 -m venv /opt/toolrun-test-venv && \
         /opt/toolrun-test-venv/bin/pip install mcp==2.3.0` (or set TOOLRUN_TEST_PYTHON)",
        p.display()
    );
    p
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/client.py")
}

/// A gateway with the local sandbox, sessions in a fresh state dir, and MCP on a free port.
struct Gw {
    running: Option<Running>,
    mcp: SocketAddr,
    state: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Gw {
    async fn new(yaml: &str) -> Gw {
        ensure_runner_built();
        let tmp = tempfile::tempdir().unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let state = tmp.path().canonicalize().unwrap();
        let config = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(config.path(), yaml).unwrap();
        let running = start(ServeArgs {
            listen: "127.0.0.1:0".parse().unwrap(),
            admin_listen: "127.0.0.1:0".parse().unwrap(),
            mcp_listen: Listen::On("127.0.0.1:0".parse().unwrap()),
            config: Some(config.path().to_path_buf()),
            drain_timeout_ms: 1_000,
            state_dir: Some(state.clone()),
            ..ServeArgs::default()
        })
        .await
        .expect("gateway with the local sandbox starts (run the tests as root)");
        let mcp = running.mcp_addr.expect("MCP is served");
        Gw {
            running: Some(running),
            mcp,
            state,
            _tmp: tmp,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/mcp", self.mcp)
    }

    fn running(&self) -> &Running {
        self.running.as_ref().unwrap()
    }

    async fn grpc(&self) -> Client {
        ToolServiceClient::connect(format!("http://{}", self.running().grpc_addr))
            .await
            .unwrap()
    }

    /// A session in `mode`, created over gRPC.
    async fn session(&self, mode: pb::ApprovalMode) -> String {
        self.grpc()
            .await
            .create_session(pb::CreateSessionRequest {
                session_id: String::new(),
                approval_mode: mode as i32,
                idle_timeout_seconds: 0,
            })
            .await
            .expect("CreateSession")
            .into_inner()
            .session_id
    }

    /// Runs a client.py scenario against this gateway; its JSON output.
    async fn py(&self, args: &[&str]) -> Value {
        run_script(&self.url(), args).await
    }

    /// `toolrun_calls_total` for `tool` and `code`.
    async fn calls(&self, tool: &str, code: &str) -> u64 {
        let (status, _, body) = raw(
            self.running().admin_addr,
            "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".into(),
        )
        .await;
        assert_eq!(status, 200);
        let text = String::from_utf8_lossy(&body);
        text.lines()
            .filter(|l| {
                l.starts_with("toolrun_calls_total{")
                    && l.contains(&format!("tool=\"{tool}\""))
                    && l.contains(&format!("code=\"{code}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|v| v as u64)
            .sum()
    }
}

impl Drop for Gw {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown();
        }
        // Detach workspaces a failed test left mounted.
        let prefix = format!("{}/", self.state.join("workspaces").display());
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for mp in info.lines().filter_map(|l| l.split(' ').nth(4)) {
            if mp.starts_with(&prefix) {
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(mp)
                    .status();
            }
        }
    }
}

async fn run_script(url: &str, args: &[&str]) -> Value {
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(script())
        .arg(url)
        .args(args)
        .kill_on_drop(true)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = tokio::time::timeout(SCRIPT_BOUND, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("client.py {args:?} did not finish in {SCRIPT_BOUND:?}"))
        .expect("client.py runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "client.py {args:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("client.py {args:?} printed no JSON ({e}):\n{stdout}\n{stderr}"))
}

/// One raw HTTP/1.1 exchange (`Connection: close`, an answer required): status, head, body.
async fn raw(addr: SocketAddr, head: String) -> (u16, String, Vec<u8>) {
    raw_with_body(addr, head, &[]).await
}

async fn raw_with_body(addr: SocketAddr, head: String, body: &[u8]) -> (u16, String, Vec<u8>) {
    let r = raw_http::exchange(addr, &head, body, raw_http::Expect::Answer).await;
    (r.status, r.head, r.body)
}

/// A POST to /mcp with `extra` header lines and a JSON body.
fn post(extra: &str, body: &str) -> String {
    format!("{}{body}", raw_http::post_head("/mcp", extra, body.len()))
}

const LIST: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;

fn body_json(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(body)))
}

fn structured(r: &Value) -> &Value {
    &r["structured"]
}

fn error_code(r: &Value) -> &str {
    r["structured"]["error"]["code"].as_str().unwrap_or("")
}

// ---------------------------------------------------------------- tests

#[tokio::test(flavor = "multi_thread")]
async fn tools_are_listed_with_schemas_and_annotations() {
    let gw = Gw::new("{}").await;
    let out = gw.py(&["list", "2025-11-25"]).await;
    assert_eq!(out["protocol_version"], "2025-11-25");
    let tools = out["tools"].as_array().unwrap();
    let by_name = |n: &str| {
        tools
            .iter()
            .find(|t| t["name"] == n)
            .unwrap_or_else(|| panic!("{n} is not listed: {out}"))
    };
    // Every tool the gateway serves, sessions' tools included, once.
    let grpc = gw
        .grpc()
        .await
        .list_tools(pb::ListToolsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .tools;
    let mut listed: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    let mut served: Vec<&str> = grpc.iter().map(|t| t.id.as_str()).collect();
    listed.sort();
    served.sort();
    assert_eq!(listed, served);
    for t in ["read_file", "write_file", "shell", "run_code"] {
        assert!(listed.contains(&t), "{t} missing from {listed:?}");
    }
    // Input schemas are the tools' own.
    for def in &grpc {
        let own: Value = serde_json::from_str(&def.input_schema_json).unwrap();
        assert_eq!(by_name(&def.id)["inputSchema"], own, "{}", def.id);
    }
    // Output schemas: the tool's own object schema, or the error envelope.
    let calc = by_name("calculator");
    let any_of = calc["outputSchema"]["anyOf"].as_array().unwrap();
    assert_eq!(any_of[0]["required"], json!(["value", "formatted"]));
    assert_eq!(any_of[1]["required"], json!(["error"]));
    assert_eq!(calc["outputSchema"]["type"], "object");
    // Annotations from the metadata.
    let ann = |n: &str| {
        let a = &by_name(n)["annotations"];
        (
            a["readOnlyHint"].as_bool(),
            a["destructiveHint"].as_bool(),
            a["idempotentHint"].as_bool(),
            a["openWorldHint"].as_bool(),
        )
    };
    assert_eq!(
        ann("calculator"),
        (Some(true), Some(false), Some(true), Some(false))
    );
    assert_eq!(
        ann("read_file"),
        (Some(true), Some(false), Some(true), Some(false))
    );
    assert_eq!(
        ann("write_file"),
        (Some(false), Some(true), Some(true), Some(false))
    );
    assert_eq!(ann("delete_file").1, Some(true));
    assert_eq!(
        ann("run_code"),
        (Some(false), Some(true), Some(false), Some(false))
    );
    assert_eq!(
        ann("shell"),
        (Some(false), Some(true), Some(false), Some(false))
    );
    assert_eq!(by_name("calculator")["title"], "Calculator");
}

#[tokio::test(flavor = "multi_thread")]
async fn calls_answer_with_structured_content_and_typed_errors() {
    let gw = Gw::new("{}").await;
    let out = gw.py(&["call"]).await;
    let calc = &out["calculator"];
    assert_eq!(calc["is_error"], false);
    assert_eq!(structured(calc), &json!({"value": 14, "formatted": "14"}));
    assert_eq!(calc["text"], json!([r#"{"formatted":"14","value":14}"#]));
    let hash = calc["meta"]["toolrun.dev/output_hash"].as_str().unwrap();
    assert_eq!(hash.len(), 64);
    assert!(calc["meta"]["toolrun.dev/call_id"].is_string());
    assert_eq!(
        structured(&out["echo"]),
        &json!({"x": [1, "a", {"b": null}]})
    );

    let out = gw.py(&["errors"]).await;
    for case in ["missing", "wrong_type"] {
        let r = &out[case];
        assert_eq!(r["is_error"], true, "{case}: {r}");
        assert_eq!(error_code(r), "INVALID_ARGUMENTS", "{case}: {r}");
        let text = r["text"][0].as_str().unwrap();
        assert!(text.starts_with("INVALID_ARGUMENTS: "), "{text}");
    }
    assert_eq!(
        out["missing"]["structured"]["error"]["details"]["errors"][0]["rule"],
        "/required"
    );
    assert_eq!(
        out["wrong_type"]["structured"]["error"]["details"]["errors"][0]["path"],
        "/expression"
    );
    assert_eq!(error_code(&out["division"]), "DIVISION_BY_ZERO");
    // An unknown tool is a protocol error, -32602, naming the tools there are.
    let unknown = &out["unknown"];
    assert_eq!(unknown["raised"], true, "{unknown}");
    assert_eq!(unknown["code"], -32602);
    assert_eq!(unknown["data"]["code"], "UNKNOWN_TOOL");
    assert!(unknown["message"].as_str().unwrap().contains("calculator"));
    assert_eq!(structured(&out["after"]), &json!({"still": "serving"}));
    // The executor saw them: audit and metrics count every verdict.
    assert_eq!(gw.calls("calculator", "INVALID_ARGUMENTS").await, 2);
    assert_eq!(gw.calls("no_such_tool", "UNKNOWN_TOOL").await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_protocol_version_negotiates() {
    let gw = Gw::new("{}").await;
    let out = gw.py(&["versions"]).await;
    for (mode, expect) in [
        ("2025-06-18", "2025-06-18"),
        ("2025-11-25", "2025-11-25"),
        ("2026-07-28", "2026-07-28"),
        // The client's own negotiation picks the newest.
        ("auto", "2026-07-28"),
    ] {
        let r = &out[mode];
        assert_eq!(r["protocol_version"], expect, "{mode}: {r}");
        assert!(r["tools"].as_u64().unwrap() >= 10, "{mode}: {r}");
        assert_eq!(structured(&r["echo"]), &json!({"mode": mode}), "{mode}");
    }
    // A version the gateway does not serve is answered with one it does (raw initialize).
    let init = |v: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"{v}","capabilities":{{}},"clientInfo":{{"name":"raw","version":"1"}}}}}}"#
        )
    };
    let (status, head, body) = raw(
        gw.mcp,
        post("", &init("2025-03-26")).replace("MCP-Protocol-Version: 2025-11-25\r\n", ""),
    )
    .await;
    assert_eq!(status, 200, "{head}");
    let v = body_json(&body);
    assert_eq!(v["result"]["protocolVersion"], "2025-11-25", "{v}");
    // initialize answers carry the client id that scopes notification cancellations.
    assert!(
        head.to_ascii_lowercase().contains("mcp-session-id: "),
        "{head}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn progress_notifications_carry_live_output() {
    let gw = Gw::new("{}").await;
    let out = gw.py(&["progress"]).await;
    let events = out["events"].as_array().unwrap();
    let messages: Vec<&str> = events
        .iter()
        .map(|e| e["message"].as_str().unwrap_or(""))
        .collect();
    for i in 0..3 {
        assert!(
            messages.iter().any(|m| m.contains(&format!("line {i}"))),
            "line {i} not in {messages:?}"
        );
    }
    assert!(messages.iter().any(|m| m.contains("oops")), "{messages:?}");
    // Progress only grows.
    let progress: Vec<f64> = events
        .iter()
        .map(|e| e["progress"].as_f64().unwrap())
        .collect();
    assert!(progress.windows(2).all(|w| w[0] < w[1]), "{progress:?}");
    // The first line arrived while the program still ran (it sleeps 0.3 s per line).
    let first = events
        .iter()
        .find(|e| e["message"].as_str().unwrap_or("").contains("line 0"))
        .unwrap();
    assert!(
        first["before_end_ms"].as_u64().unwrap() >= 400,
        "line 0 came only at the end: {out}"
    );
    let result = &out["result"];
    assert_eq!(result["is_error"], false, "{result}");
    assert_eq!(structured(result)["stdout"], "line 0\nline 1\nline 2\n");
    assert_eq!(structured(result)["stderr"], "oops\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn cancellation_kills_the_run() {
    let gw = Gw::new("{}").await;
    let sid = gw.session(pb::ApprovalMode::All).await;
    let ws = gw.state.join("workspaces").join(&sid);
    // The control: not cancelled, the program writes its file after 5 s.
    let control = gw.py(&["complete", &sid]).await;
    assert_eq!(control["run"]["is_error"], false, "{control}");
    assert_eq!(control["read"]["is_error"], false, "{control}");
    assert!(ws.join("late-control.txt").is_file());
    let cancelled_before = gw.calls("run_code", "CANCELLED").await;
    // 2025-11-25: the client POSTs notifications/cancelled while the call's POST stays
    // open; 2026-07-28: the client closes the call's stream.
    for mode in ["2025-11-25", "2026-07-28"] {
        let out = gw.py(&["cancel", mode, &sid]).await;
        assert_eq!(out["protocol_version"], mode, "{out}");
        assert!(out.get("finished").is_none(), "the call finished: {out}");
        assert!(out["waited_ms"].as_u64().unwrap() >= 5_500, "{out}");
        assert_eq!(out["read"]["is_error"], true, "{mode}: {out}");
        assert_eq!(error_code(&out["read"]), "FILE_NOT_FOUND", "{mode}: {out}");
        assert!(!ws.join(format!("late-{mode}.txt")).exists(), "{mode}");
    }
    assert_eq!(
        gw.calls("run_code", "CANCELLED").await - cancelled_before,
        2,
        "each cancelled run is counted as CANCELLED"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn session_file_tools_through_mcp() {
    let gw = Gw::new("{}").await;
    let sid = gw.session(pb::ApprovalMode::All).await;
    let out = gw.py(&["session", &sid]).await;
    assert_eq!(out["write_meta"]["is_error"], false, "{out}");
    let read = structured(&out["read_meta"]);
    assert!(
        read["content"].as_str().unwrap().contains("via _meta"),
        "{read}"
    );
    // Without a session the file tools say how to name one.
    assert_eq!(error_code(&out["no_session"]), "INVALID_ARGUMENTS");
    assert_eq!(error_code(&out["unknown_session"]), "SESSION_NOT_FOUND");
    // The header and _meta disagree: refused, naming both.
    assert_eq!(error_code(&out["conflict"]), "INVALID_ARGUMENTS");
    assert!(
        out["conflict"]["text"][0]
            .as_str()
            .unwrap()
            .contains("two session ids")
    );
    assert_eq!(out["write_header"]["is_error"], false, "{out}");
    let listing = structured(&out["list_header"]).to_string();
    assert!(
        listing.contains("b.txt") && listing.contains("notes"),
        "{listing}"
    );
    assert!(
        structured(&out["read_url"])["content"]
            .as_str()
            .unwrap()
            .contains("via header")
    );
    // The files are the session's workspace.
    let ws = gw.state.join("workspaces").join(&sid);
    assert_eq!(
        std::fs::read_to_string(ws.join("b.txt")).unwrap(),
        "via header\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("notes/a.txt")).unwrap(),
        "via _meta\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_waiting_for_approval_is_approved_with_toolrun_approve() {
    let gw = Gw::new("{}").await;
    // Mode safe: run_code in a session asks.
    let sid = gw.session(pb::ApprovalMode::Safe).await;
    let url = gw.url();
    let sid2 = sid.clone();
    let client = tokio::spawn(async move { run_script(&url, &["approval", &sid2]).await });
    let mut grpc = gw.grpc().await;
    let approval = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let list = grpc
                .list_approvals(pb::ListApprovalsRequest {
                    session_id: sid.clone(),
                })
                .await
                .unwrap()
                .into_inner()
                .approvals;
            if let Some(a) = list.into_iter().next() {
                return a;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the MCP call asks for approval");
    assert_eq!(approval.tool, "run_code");
    let addr = format!("http://{}", gw.running().grpc_addr);
    let id = approval.approval_id.clone();
    let status = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_toolrun"))
            .args(["approve", &id])
            .env("TOOLRUN_ADDR", addr)
            .status()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(status.success(), "toolrun approve failed");
    let out = client.await.unwrap();
    assert_eq!(out["result"]["is_error"], false, "{out}");
    assert_eq!(structured(&out["result"])["stdout"], "approved-run\n");
    // The wait was announced in a progress notification naming the approval.
    let progress = out["progress"].to_string();
    assert!(
        progress.contains("waiting for approval") && progress.contains(&approval.approval_id),
        "{progress}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn foreign_hosts_and_origins_are_refused() {
    // The chart's shape: the Service's names plus loopback; one web app may call.
    let gw = Gw::new(
        "mcp:\n  allowed_hosts: [localhost, 127.0.0.1, toolrun.tools.svc]\n  \
         allowed_origins: [\"https://app.example\"]\n",
    )
    .await;
    let url = gw.url();
    let py = |host: &'static str, origin: &'static str| {
        let url = url.clone();
        async move { run_script(&url, &["http", host, origin]).await }
    };
    // The official client: refused with the reason; the allowed ones connect.
    let out = py("evil.example", "-").await;
    assert_eq!(out["connected"], false, "{out}");
    assert!(
        out["error"].as_str().unwrap().contains("mcp.allowed_hosts"),
        "{out}"
    );
    let out = py("-", "https://evil.example").await;
    assert_eq!(out["connected"], false, "{out}");
    assert!(
        out["error"]
            .as_str()
            .unwrap()
            .contains("mcp.allowed_origins"),
        "{out}"
    );
    assert_eq!(py("toolrun.tools.svc", "-").await["connected"], true);
    assert_eq!(py("-", "https://app.example").await["connected"], true);

    // Raw HTTP: 403 with the reason, and the controls pass.
    let with = |host: &str, origin: Option<&str>| {
        let o = origin
            .map(|o| format!("Origin: {o}\r\n"))
            .unwrap_or_default();
        post(&o, LIST).replace("Host: 127.0.0.1", &format!("Host: {host}"))
    };
    for (host, origin, allowed) in [
        ("evil.example", None, false),
        // DNS rebinding: a foreign name resolving to loopback still sends its own Host.
        ("rebind.evil.example:8080", None, false),
        ("127.0.0.1", Some("https://evil.example"), false),
        ("127.0.0.1", Some("null"), false),
        ("localhost", Some("http://localhost:3000"), false),
        ("127.0.0.1", None, true),
        ("toolrun.tools.svc", None, true),
        ("localhost:8080", Some("https://app.example"), true),
    ] {
        let (status, _, body) = raw(gw.mcp, with(host, origin)).await;
        let text = String::from_utf8_lossy(&body);
        if allowed {
            assert_eq!(status, 200, "{host} {origin:?}: {text}");
            assert!(body_json(&body)["result"]["tools"].is_array());
        } else {
            assert_eq!(status, 403, "{host} {origin:?}: {text}");
            assert_eq!(body_json(&body)["error"]["code"], -32600);
            assert!(text.contains("is not allowed"), "{text}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_and_malformed_requests_are_refused_and_serving_goes_on() {
    let gw = Gw::new("{}").await;
    // The official client: a 5 MiB argument is refused with the limit named; the same
    // connection goes on serving.
    let out = gw.py(&["oversize"]).await;
    assert_eq!(out["big"]["raised"], true, "{out}");
    let message = out["big"]["message"].as_str().unwrap();
    assert!(message.contains("4194304 bytes"), "{message}");
    assert_eq!(structured(&out["after"]), &json!({"small": true}));

    // Declared too large: refused before the body is read.
    let big = vec![b' '; 5 * 1024 * 1024];
    let head = post("", "").replace(
        "Content-Length: 0",
        &format!("Content-Length: {}", big.len()),
    );
    let (status, _, body) = raw_with_body(gw.mcp, head, &big).await;
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));
    assert!(
        body_json(&body)["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-message-bytes")
    );
    // Chunked, no length: cut at the limit.
    let head = post("Transfer-Encoding: chunked\r\n", "").replace("Content-Length: 0\r\n", "");
    let mut chunked = Vec::new();
    for _ in 0..6 {
        chunked.extend_from_slice(format!("{:x}\r\n", 1 << 20).as_bytes());
        chunked.extend(std::iter::repeat_n(b' ', 1 << 20));
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let (status, _, body) = raw_with_body(gw.mcp, head, &chunked).await;
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));

    // Malformed JSON, batches, non-objects, deep nesting: typed JSON-RPC errors.
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo","arguments":{{"a":{}1{}}}}}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    for (body, code) in [
        (r#"{"jsonrpc":"2.0","id":1,"#.to_string(), -32700),
        ("not json".to_string(), -32700),
        (format!("[{LIST},{LIST}]"), -32600),
        ("5".to_string(), -32600),
        (deep, -32600),
    ] {
        let (status, _, answer) = raw(gw.mcp, post("", &body)).await;
        assert_eq!(
            status,
            400,
            "{body:.60}: {}",
            String::from_utf8_lossy(&answer)
        );
        assert_eq!(body_json(&answer)["error"]["code"], code, "{body:.60}");
    }
    // Still serving.
    let (status, _, body) = raw(gw.mcp, post("", LIST)).await;
    assert_eq!(status, 200);
    assert!(body_json(&body)["result"]["tools"].is_array());
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_is_not_held_up_by_idle_mcp_connections() {
    let mut gw = Gw::new("{}").await;
    // A client that keeps its connection open after an answer, as MCP clients do.
    let mut s = tokio::net::TcpStream::connect(gw.mcp).await.unwrap();
    let keep_alive = post("", LIST).replace("Connection: close\r\n", "");
    s.write_all(keep_alive.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let running = gw.running.take().unwrap();
    running.shutdown();
    tokio::time::timeout(Duration::from_secs(5), running.wait())
        .await
        .expect("the gateway stops within 5 s with an idle MCP connection open")
        .expect("stops cleanly");
    // The idle connection was closed by the server.
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0, "the connection is closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_endpoint_is_served_on_the_same_listener_behind_the_same_guard() {
    // `POST /v1/{provider}/tool-calls` lives beside /mcp on --mcp-listen, with the same Host
    // check (a foreign Host is refused before the body is read).
    let gw = Gw::new("{}").await;
    let message = r#"{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"calculator","arguments":"{\"expression\":\"6*7\"}"}}]}"#;
    let request = |host: &str| {
        format!(
            "POST /v1/openai/tool-calls HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{message}",
            message.len()
        )
    };
    let (status, head, body) = raw(gw.mcp, request("127.0.0.1")).await;
    assert_eq!(status, 200, "{head}\n{}", String::from_utf8_lossy(&body));
    let results = body_json(&body);
    let first = &results.as_array().unwrap_or_else(|| panic!("{results}"))[0];
    assert_eq!(first["role"], "tool", "{results}");
    assert_eq!(first["tool_call_id"], "call_1", "{results}");
    assert!(
        first["content"].as_str().unwrap().contains("42"),
        "{results}"
    );
    let (status, _, body) = raw(gw.mcp, request("evil.example")).await;
    assert_eq!(status, 403, "{}", String::from_utf8_lossy(&body));
}

/// A `tools/call` answered by the gateway's direct path (a plain call at a handshake
/// version) and the same call through rmcp (a progress token in `_meta` sends it there) get
/// the same answer: result, tool failure and unknown tool alike, number and string ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_call_gets_the_answer_rmcp_gives() {
    let gw = Gw::new("{}").await;
    // The call id and the duration differ from call to call.
    let answer = |body: &[u8]| {
        let mut v = body_json(body);
        if let Some(meta) = v["result"]["_meta"].as_object_mut() {
            assert!(meta.remove("toolrun.dev/call_id").is_some(), "{meta:?}");
            assert!(meta.remove("toolrun.dev/duration_us").is_some(), "{meta:?}");
        }
        v
    };
    for (id, params) in [
        (
            json!(3),
            json!({"name": "calculator", "arguments": {"expression": "6*7"}}),
        ),
        (
            json!("a-1"),
            json!({"name": "calculator", "arguments": {"expression": 7}}),
        ),
        (
            json!(4),
            json!({"name": "echo", "arguments": {"message": "hé \"x\""}}),
        ),
        (json!(5), json!({"name": "no_such_tool", "arguments": {}})),
    ] {
        let direct = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
        let mut through_rmcp = direct.clone();
        through_rmcp["params"]["_meta"] = json!({"progressToken": "p"});
        let (s1, h1, b1) = raw(gw.mcp, post("", &direct.to_string())).await;
        let (s2, h2, b2) = raw(gw.mcp, post("", &through_rmcp.to_string())).await;
        assert_eq!((s1, s2), (200, 200), "{h1}\n{h2}");
        for h in [&h1, &h2] {
            assert!(
                h.to_ascii_lowercase()
                    .contains("content-type: application/json"),
                "{h}"
            );
        }
        let (a1, a2) = (answer(&b1), answer(&b2));
        assert_eq!(a1, a2, "{params}");
        assert_eq!(a1["id"], id, "{a1}");
    }
}

/// A plain call (answered by the direct path) is cancelled by the client's
/// `notifications/cancelled` like one rmcp runs: the run is killed before it writes its
/// file; the control, not cancelled, writes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_call_is_cancelled_by_notification() {
    let gw = Gw::new("{}").await;
    let sid = gw.session(pb::ApprovalMode::All).await;
    let ws = gw.state.join("workspaces").join(&sid);
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}});
    let (status, head, _) = raw(gw.mcp, post("", &init.to_string())).await;
    assert_eq!(status, 200, "{head}");
    let client = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("mcp-session-id")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no Mcp-Session-Id: {head}"));
    let extra = format!("Mcp-Session-Id: {client}\r\ntoolrun-session-id: {sid}\r\n");
    let late = |name: &str| {
        let code =
            format!("import time\ntime.sleep(4)\nopen('/workspace/{name}', 'w').write('x')\n");
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
            "name": "run_code", "arguments": {"language": "python", "code": code}}})
        .to_string()
    };
    // The control: not cancelled, the program writes its file.
    let (status, _, body) = raw(gw.mcp, post(&extra, &late("late-control.txt"))).await;
    assert_eq!(status, 200);
    assert_eq!(
        body_json(&body)["result"]["isError"],
        false,
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert!(ws.join("late-control.txt").is_file());
    let cancelled_before = gw.calls("run_code", "CANCELLED").await;
    let call = tokio::spawn({
        let (addr, head) = (gw.mcp, post(&extra, &late("late-direct.txt")));
        async move { raw(addr, head).await }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 7, "reason": "test"}});
    let t = std::time::Instant::now();
    let (status, _, _) = raw(gw.mcp, post(&extra, &cancel.to_string())).await;
    assert_eq!(status, 202);
    let (status, _, body) = call.await.unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "answered {:?} after the cancel",
        t.elapsed()
    );
    assert_eq!(status, 200);
    let answer = body_json(&body);
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    assert_eq!(
        answer["result"]["structuredContent"]["error"]["code"], "CANCELLED",
        "{answer}"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        !ws.join("late-direct.txt").exists(),
        "the cancelled run wrote its file"
    );
    assert_eq!(
        gw.calls("run_code", "CANCELLED").await - cancelled_before,
        1
    );
}
