//! Provider formats end to end: recorded assistant messages in each provider's real format
//! (tests/fixtures/providers/<provider>/<case>.json, written from the providers' published
//! API references) run through a real in-process gateway over gRPC `CallProviderTools`,
//! through the HTTP router `POST /v1/{provider}/tool-calls` served on a real socket, and
//! through `toolrun call --from`.
//!
//! A fixture holds `message` (what the provider returns), and either `codes` + `expected`
//! (the result codes in request order and the rendered result messages) or `error` (a
//! message that is refused as a whole, with this text). In `expected`, `"<any>"` matches
//! any value, a string ending in `...` matches by prefix, and an object or array matches a
//! string holding that JSON (OpenAI's `content`, Anthropic's `content`...).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use toolrun::exec::Executor;
use toolrun::providers::http::{ProviderHttp, router};
use toolrun::serve::{Running, ServeArgs, start};
use toolrun_proto::v1 as pb;
use toolrun_proto::v1::tool_service_client::ToolServiceClient;

type Client = ToolServiceClient<tonic::transport::Channel>;

const MAX_BYTES: usize = 256 * 1024;

async fn gateway() -> (Running, Client) {
    let running = start(ServeArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        no_sandbox: true,
        max_message_bytes: MAX_BYTES,
        ..ServeArgs::default()
    })
    .await
    .expect("server starts");
    let client = ToolServiceClient::connect(format!("http://{}", running.grpc_addr))
        .await
        .unwrap()
        .max_encoding_message_size(64 * 1024 * 1024);
    (running, client)
}

/// The provider router served on an ephemeral loopback port over an executor with the
/// inline tools (the same registry a `--no-sandbox` gateway serves, without sessions).
async fn http_server() -> (std::net::SocketAddr, CancellationToken) {
    let config = toolrun::config::Config::default();
    let registry = toolrun::tools::inline_registry(&config).unwrap();
    let executor = Arc::new(Executor::new(
        Arc::new(registry),
        Arc::new(toolrun::metrics::Metrics::new()),
    ));
    let stop = CancellationToken::new();
    let app = router(Arc::new(ProviderHttp {
        executor,
        hard_stop: stop.clone(),
        max_body_bytes: MAX_BYTES,
    }))
    // Every route sits behind the auth layer (a request that bypassed it may use nothing);
    // without keys it admits every caller as the anonymous tenant.
    .layer(axum::middleware::from_fn_with_state(
        toolrun::auth::Auth::disabled(),
        toolrun::auth::require_key,
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let token = stop.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { token.cancelled().await })
            .await
            .unwrap();
    });
    (addr, stop)
}

/// One HTTP/1.1 request on a fresh connection; returns (status, body as JSON or text).
async fn http_post(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Value) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    // The server may answer (413) before reading a large body; a reset write is fine.
    let _ = stream.write_all(body).await;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut raw))
        .await
        .expect("HTTP answer in time")
        .ok();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    let value = serde_json::from_str(&body).unwrap_or(Value::String(body));
    (status, value)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    loop {
        let Some((size, rest)) = s.split_once("\r\n") else {
            return out;
        };
        let n = usize::from_str_radix(size.trim(), 16)
            .unwrap_or_else(|e| panic!("bad chunk size {size:?} ({e}) in {s:?}"));
        if n == 0 {
            return out;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
}

struct Fixture {
    provider: String,
    case: String,
    v: Value,
}

fn fixtures() -> Vec<Fixture> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/providers");
    let mut out = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    dirs.sort();
    for dir in dirs {
        let provider = dir.file_name().unwrap().to_string_lossy().into_owned();
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        for f in files {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            out.push(Fixture {
                provider: provider.clone(),
                case: f.file_stem().unwrap().to_string_lossy().into_owned(),
                v,
            });
        }
    }
    // Every provider has recorded messages, and every one a malformed case.
    for p in toolrun::providers::Provider::ALL {
        let cases: Vec<&str> = out
            .iter()
            .filter(|f| f.provider == p.name())
            .map(|f| f.case.as_str())
            .collect();
        assert!(
            cases.len() >= 5 && cases.contains(&"unknown_tool") && cases.contains(&"unreadable"),
            "{}: {cases:?}",
            p.name()
        );
    }
    out
}

/// Whether `actual` matches `expected` (see the module docs); the error names the path.
fn matches(expected: &Value, actual: &Value, path: &str) -> Result<(), String> {
    match (expected, actual) {
        (Value::String(e), _) if e == "<any>" => Ok(()),
        (Value::String(e), Value::String(a)) if e.ends_with("...") => {
            if a.starts_with(e.trim_end_matches("...")) {
                Ok(())
            } else {
                Err(format!("{path}: {a:?} does not start with {e:?}"))
            }
        }
        (Value::Object(_) | Value::Array(_), Value::String(a)) => {
            let parsed: Value =
                serde_json::from_str(a).map_err(|e| format!("{path}: {a:?} is not JSON ({e})"))?;
            matches(expected, &parsed, path)
        }
        (Value::Object(e), Value::Object(a)) => {
            let mut ek: Vec<&String> = e.keys().collect();
            let mut ak: Vec<&String> = a.keys().collect();
            ek.sort();
            ak.sort();
            if ek != ak {
                return Err(format!("{path}: keys {ak:?}, expected {ek:?}"));
            }
            for (k, ev) in e {
                matches(ev, &a[k], &format!("{path}.{k}"))?;
            }
            Ok(())
        }
        (Value::Array(e), Value::Array(a)) => {
            if e.len() != a.len() {
                return Err(format!("{path}: {} items, expected {}", a.len(), e.len()));
            }
            for (i, (ev, av)) in e.iter().zip(a).enumerate() {
                matches(ev, av, &format!("{path}[{i}]"))?;
            }
            Ok(())
        }
        _ if expected == actual => Ok(()),
        _ => Err(format!("{path}: {actual}, expected {expected}")),
    }
}

fn code_name(r: &pb::ToolResult) -> String {
    match &r.error {
        None => "OK".into(),
        Some(e) => toolrun::grpc::error_code_name(e.code),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_messages_over_grpc() {
    let (_s, mut client) = gateway().await;
    let all = fixtures();
    for f in &all {
        let what = format!("{}/{}", f.provider, f.case);
        let resp = client
            .call_provider_tools(pb::CallProviderToolsRequest {
                provider: f.provider.clone(),
                message_json: f.v["message"].to_string(),
                session_id: String::new(),
            })
            .await;
        if let Some(error) = f.v["error"].as_str() {
            let status = resp.expect_err(&what);
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{what}");
            assert!(
                status.message().contains(error) && status.message().contains(&f.provider),
                "{what}: {}",
                status.message()
            );
            continue;
        }
        let resp = resp.unwrap_or_else(|e| panic!("{what}: {e}")).into_inner();
        let codes: Vec<String> = resp.results.iter().map(code_name).collect();
        assert_eq!(json!(codes), f.v["codes"], "{what}");
        let rendered: Value = serde_json::from_str(&resp.results_json).unwrap();
        matches(&f.v["expected"], &rendered, "$").unwrap_or_else(|e| panic!("{what}: {e}"));
        // The toolrun results carry the provider's ids where it gave them.
        let calls = toolrun::providers::Provider::from_name(&f.provider)
            .unwrap()
            .parse(&f.v["message"])
            .unwrap();
        for (c, r) in calls.iter().zip(&resp.results) {
            if !c.id.is_empty() {
                assert_eq!(r.call_id, c.id, "{what}");
            } else {
                assert!(!r.call_id.is_empty(), "{what}: the executor names the call");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_messages_over_http() {
    let (addr, _stop) = http_server().await;
    for f in &fixtures() {
        let what = format!("{}/{}", f.provider, f.case);
        let (status, body) = http_post(
            addr,
            &format!("/v1/{}/tool-calls", f.provider),
            &[],
            f.v["message"].to_string().as_bytes(),
        )
        .await;
        if let Some(error) = f.v["error"].as_str() {
            assert_eq!(status, 400, "{what}: {body}");
            assert_eq!(body["error"]["code"], "bad_message", "{what}");
            assert!(
                body["error"]["message"].as_str().unwrap().contains(error),
                "{what}: {body}"
            );
            continue;
        }
        assert_eq!(status, 200, "{what}: {body}");
        matches(&f.v["expected"], &body, "$").unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_message_errors_are_typed_on_both_doors() {
    let (_s, mut client) = gateway().await;
    let (addr, _stop) = http_server().await;
    let ok_message = json!({"tool_call": {"tool_id": "echo", "input": {"a": 1}}}).to_string();

    // Unknown provider: the list of providers.
    let status = client
        .call_provider_tools(pb::CallProviderToolsRequest {
            provider: "cohere".into(),
            message_json: ok_message.clone(),
            session_id: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status
            .message()
            .contains("openai, openai-responses, anthropic, ollama, gemini, toolrun"),
        "{}",
        status.message()
    );
    let (code, body) = http_post(addr, "/v1/cohere/tool-calls", &[], ok_message.as_bytes()).await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_provider");
    assert_eq!(body["error"]["providers"].as_array().unwrap().len(), 6);

    // Not JSON; JSON without calls.
    for (text, grpc_has, http_code) in [
        ("{\"role\":", "not valid JSON", "not_json"),
        (
            r#"{"role":"assistant","content":"Hello!"}"#,
            "no tool calls",
            "no_tool_calls",
        ),
    ] {
        let status = client
            .call_provider_tools(pb::CallProviderToolsRequest {
                provider: "openai".into(),
                message_json: text.into(),
                session_id: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(grpc_has), "{}", status.message());
        let (code, body) = http_post(addr, "/v1/openai/tool-calls", &[], text.as_bytes()).await;
        assert_eq!(code, 400, "{body}");
        assert_eq!(body["error"]["code"], http_code);
    }

    // More calls than a batch may hold: RESOURCE_EXHAUSTED / 413; 256 is the limit.
    let calls = |n: usize| {
        let calls: Vec<Value> = (0..n)
            .map(|i| {
                json!({"id": format!("c{i}"), "type": "function",
                            "function": {"name": "echo", "arguments": "{}"}})
            })
            .collect();
        json!({"role": "assistant", "tool_calls": calls}).to_string()
    };
    let status = client
        .call_provider_tools(pb::CallProviderToolsRequest {
            provider: "openai".into(),
            message_json: calls(257),
            session_id: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let (code, body) = http_post(addr, "/v1/openai/tool-calls", &[], calls(257).as_bytes()).await;
    assert_eq!(code, 413, "{body}");
    assert_eq!(body["error"]["code"], "too_many_calls");
    // Control: at the limit, every call runs.
    let resp = client
        .call_provider_tools(pb::CallProviderToolsRequest {
            provider: "openai".into(),
            message_json: calls(256),
            session_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.results.len(), 256);
    assert!(resp.results.iter().all(|r| r.ok));
    let (code, body) = http_post(addr, "/v1/openai/tool-calls", &[], calls(256).as_bytes()).await;
    assert_eq!(code, 200);
    assert_eq!(body.as_array().unwrap().len(), 256);
    assert_eq!(body[255]["tool_call_id"], "c255");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_size_is_bounded_like_grpc_and_the_service_keeps_serving() {
    let (_s, mut client) = gateway().await;
    let (addr, _stop) = http_server().await;
    // A message just over the bound: one call with a big argument.
    let big = json!({"tool_call": {"tool_id": "echo", "input": {"pad": "x".repeat(MAX_BYTES)}}})
        .to_string();
    let (code, body) = http_post(addr, "/v1/toolrun/tool-calls", &[], big.as_bytes()).await;
    assert_eq!(code, 413, "{body}");
    assert_eq!(body["error"]["code"], "body_too_large");
    let status = client
        .call_provider_tools(pb::CallProviderToolsRequest {
            provider: "toolrun".into(),
            message_json: big,
            session_id: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    // Control: the same message under the bound runs, on both doors, right after (a
    // quarter of the bound: the gRPC answer carries the output twice, rendered and raw).
    let small =
        json!({"tool_call": {"tool_id": "echo", "input": {"pad": "x".repeat(MAX_BYTES / 4)}}})
            .to_string();
    let (code, body) = http_post(addr, "/v1/toolrun/tool-calls", &[], small.as_bytes()).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["tool_result"]["success"], true);
    let resp = client
        .call_provider_tools(pb::CallProviderToolsRequest {
            provider: "toolrun".into(),
            message_json: small,
            session_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(resp.results[0].ok);
}

/// The message's session applies to every call: file tools read the session's workspace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_applies_to_every_call() {
    let (_s, mut client) = gateway().await;
    let session = client
        .create_session(pb::CreateSessionRequest {
            session_id: String::new(),
            approval_mode: pb::ApprovalMode::All as i32,
            idle_timeout_seconds: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .session_id;
    let write = json!({"role": "assistant", "tool_calls": [
        {"id": "w1", "type": "function", "function": {"name": "write_file",
         "arguments": json!({"path": "a.txt", "content": "alpha"}).to_string()}},
        {"id": "w2", "type": "function", "function": {"name": "write_file",
         "arguments": json!({"path": "b.txt", "content": "beta"}).to_string()}}
    ]});
    let resp = client
        .call_provider_tools(pb::CallProviderToolsRequest {
            provider: "openai".into(),
            message_json: write.to_string(),
            session_id: session.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(resp.results.iter().all(|r| r.ok), "{:?}", resp.results);
    let read = json!({"type": "message", "role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_a", "name": "read_file", "input": {"path": "a.txt"}},
        {"type": "tool_use", "id": "toolu_b", "name": "read_file", "input": {"path": "b.txt"}}
    ]});
    let resp = client
        .call_provider_tools(pb::CallProviderToolsRequest {
            provider: "anthropic".into(),
            message_json: read.to_string(),
            session_id: session.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let rendered: Value = serde_json::from_str(&resp.results_json).unwrap();
    for (i, want) in ["alpha", "beta"].iter().enumerate() {
        let block = &rendered["content"][i];
        assert_eq!(block["is_error"], false, "{rendered}");
        let content: Value = serde_json::from_str(block["content"].as_str().unwrap()).unwrap();
        assert!(
            content["content"].as_str().unwrap().contains(want),
            "{content}"
        );
    }
    // Control: without the session the same calls fail, each saying they need one.
    let resp = client
        .call_provider_tools(pb::CallProviderToolsRequest {
            provider: "anthropic".into(),
            message_json: read.to_string(),
            session_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    for r in &resp.results {
        assert!(!r.ok);
        assert!(
            r.error.as_ref().unwrap().message.contains("session"),
            "{r:?}"
        );
    }
    // And another session's id is not this one's.
    let resp = client
        .call_provider_tools(pb::CallProviderToolsRequest {
            provider: "anthropic".into(),
            message_json: read.to_string(),
            session_id: "no-such-session".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        resp.results
            .iter()
            .all(|r| code_name(r) == "SESSION_NOT_FOUND"),
        "{:?}",
        resp.results
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_takes_the_session_from_the_query_or_the_header() {
    let (addr, _stop) = http_server().await;
    let msg = json!({"tool_calls": [{"tool_id": "echo", "input": {}},
                                    {"tool_id": "calculator", "input": {"expression": "1+1"}}]})
    .to_string();
    // This router's executor serves no sessions: a session id reaches every call.
    for (path, headers) in [
        ("/v1/toolrun/tool-calls?session_id=s1", vec![]),
        ("/v1/toolrun/tool-calls", vec![("toolrun-session-id", "s1")]),
    ] {
        let (code, body) = http_post(addr, path, &headers, msg.as_bytes()).await;
        assert_eq!(code, 200, "{body}");
        for r in body["tool_results"].as_array().unwrap() {
            assert_eq!(r["success"], false, "{body}");
            assert_eq!(r["error"]["code"], "SESSION_NOT_FOUND", "{body}");
        }
    }
    // Control: without a session both calls run.
    let (code, body) = http_post(addr, "/v1/toolrun/tool-calls", &[], msg.as_bytes()).await;
    assert_eq!(code, 200);
    assert!(
        body["tool_results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["success"] == true),
        "{body}"
    );
    // Two different sessions named at once: refused.
    let (code, body) = http_post(
        addr,
        "/v1/toolrun/tool-calls?session_id=s1",
        &[("toolrun-session-id", "s2")],
        msg.as_bytes(),
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["error"]["code"], "bad_session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_in_every_provider_format() {
    let (_s, client) = gateway().await;
    let list = |format: pb::ToolFormat| {
        let mut client = client.clone();
        async move {
            client
                .list_tools(pb::ListToolsRequest {
                    format: format as i32,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
                .tools
        }
    };
    for t in list(pb::ToolFormat::Openai).await {
        let v: Value = serde_json::from_str(&t.rendered_json).unwrap();
        assert_eq!(v["type"], "function");
        assert_eq!(v["function"]["name"], t.id.as_str());
        let schema: Value = serde_json::from_str(&t.input_schema_json).unwrap();
        assert_eq!(
            v["function"]["strict"],
            toolrun::providers::strict_qualifies(&schema),
            "{}",
            t.id
        );
        assert!(t.id.len() <= 64);
    }
    // echo takes any object: not strict.
    let echo = list(pb::ToolFormat::Openai)
        .await
        .into_iter()
        .find(|t| t.id == "echo")
        .unwrap();
    let v: Value = serde_json::from_str(&echo.rendered_json).unwrap();
    assert_eq!(v["function"]["strict"], false);
    for t in list(pb::ToolFormat::OpenaiResponses).await {
        let v: Value = serde_json::from_str(&t.rendered_json).unwrap();
        assert_eq!(v["type"], "function");
        assert_eq!(v["name"], t.id.as_str());
        assert_eq!(v["parameters"]["type"], "object");
        assert!(v["strict"].is_boolean());
    }
    for t in list(pb::ToolFormat::Ollama).await {
        let v: Value = serde_json::from_str(&t.rendered_json).unwrap();
        assert_eq!(v["function"]["parameters"]["type"], "object");
        assert!(v["function"].get("strict").is_none());
    }
    for t in list(pb::ToolFormat::Gemini).await {
        let v: Value = serde_json::from_str(&t.rendered_json).unwrap();
        assert_eq!(v["name"], t.id.as_str());
        assert_eq!(v["parametersJsonSchema"]["type"], "object");
    }
    for t in list(pb::ToolFormat::Mcp).await {
        let v: Value = serde_json::from_str(&t.rendered_json).unwrap();
        assert_eq!(v["inputSchema"]["type"], "object");
        assert!(v["annotations"]["readOnlyHint"].is_boolean());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_call_from_a_provider_message() {
    let (s, _client) = gateway().await;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/providers");
    let run = |args: Vec<String>, stdin: Option<String>| {
        let addr = format!("http://{}", s.grpc_addr);
        tokio::task::spawn_blocking(move || {
            let mut child = Command::new(env!("CARGO_BIN_EXE_toolrun"))
                .args(&args)
                .env("TOOLRUN_ADDR", addr)
                .stdin(if stdin.is_some() {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
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
    };
    // A file: the provider's result messages, exit 0.
    let happy = root.join("openai/parallel.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(&happy).unwrap()).unwrap();
    let msg_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(msg_file.path(), fixture["message"].to_string()).unwrap();
    let out = run(
        vec![
            "call".into(),
            "--from".into(),
            "openai".into(),
            msg_file.path().display().to_string(),
        ],
        None,
    )
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Value = serde_json::from_str(&stdout).unwrap();
    matches(&fixture["expected"], &printed, "$").unwrap();

    // stdin, a message with a failing call: printed, exit 1.
    let bad: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("gemini/wrong_type.json")).unwrap(),
    )
    .unwrap();
    let out = run(
        vec!["call".into(), "--from".into(), "gemini".into(), "-".into()],
        Some(bad["message"].to_string()),
    )
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let printed: Value = serde_json::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    matches(&bad["expected"], &printed, "$").unwrap();

    // --session reaches every call (no such session here: each says so).
    let out = run(
        vec![
            "call".into(),
            "--from".into(),
            "openai".into(),
            "--session".into(),
            "nope".into(),
            msg_file.path().display().to_string(),
        ],
        None,
    )
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let printed: Value = serde_json::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    for m in printed.as_array().unwrap() {
        assert!(
            m["content"].as_str().unwrap().contains("SESSION_NOT_FOUND"),
            "{m}"
        );
    }

    // An unreadable message: exit 3 (the RPC failed) with the reason.
    let out = run(
        vec![
            "call".into(),
            "--from".into(),
            "anthropic".into(),
            "-".into(),
        ],
        Some("{\"role\": \"assistant\"}".into()),
    )
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("content is missing"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Arguments beside --from: usage error.
    let out = run(
        vec![
            "call".into(),
            "--from".into(),
            "openai".into(),
            "-".into(),
            "{\"a\":1}".into(),
        ],
        Some("{}".into()),
    )
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// SECURITY-CASES.md 60: 10,000 tool calls, deeply nested arguments, arguments that are not
/// JSON — bounded, typed per-call errors, the other calls still answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_case_60_floods_nesting_and_garbage_are_bounded() {
    let (_s, mut client) = gateway().await;
    let (addr, _stop) = http_server().await;
    let openai = |calls: Vec<Value>| json!({"role": "assistant", "tool_calls": calls}).to_string();
    let call = |id: &str, name: &str, args: String| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}});

    // 10,000 calls: refused whole, typed, on both doors (over the size bound before the
    // call bound here; the 256-call bound is in whole_message_errors_are_typed_on_both_doors).
    let flood = openai(
        (0..10_000)
            .map(|i| call(&format!("c{i}"), "echo", "{}".into()))
            .collect(),
    );
    let status = client
        .call_provider_tools(pb::CallProviderToolsRequest {
            provider: "openai".into(),
            message_json: flood.clone(),
            session_id: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let (code, body) = http_post(addr, "/v1/openai/tool-calls", &[], flood.as_bytes()).await;
    assert_eq!(code, 413, "{body}");

    // Nesting inside OpenAI's argument text, and text that is not JSON: each is that
    // call's INVALID_ARGUMENTS; the good call between them is answered.
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let msg = openai(vec![
        call("deep", "echo", format!(r#"{{"a":{deep}}}"#)),
        call("good", "calculator", r#"{"expression":"6*7"}"#.into()),
        call("garbage", "echo", "\u{0}\u{1}not json at all".into()),
    ]);
    let resp = client
        .call_provider_tools(pb::CallProviderToolsRequest {
            provider: "openai".into(),
            message_json: msg.clone(),
            session_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let codes: Vec<String> = resp.results.iter().map(code_name).collect();
    assert_eq!(codes, ["INVALID_ARGUMENTS", "OK", "INVALID_ARGUMENTS"]);
    assert!(
        resp.results[0]
            .error
            .as_ref()
            .unwrap()
            .message
            .contains("recursion limit"),
        "{:?}",
        resp.results[0]
    );
    let (code, body) = http_post(addr, "/v1/openai/tool-calls", &[], msg.as_bytes()).await;
    assert_eq!(code, 200);
    assert_eq!(body[1]["content"], r#"{"formatted":"42","value":42}"#);

    // Nesting in a format that carries objects (Anthropic `input`) is in the message
    // itself: past serde_json's depth bound the message is refused as not JSON, typed...
    let nested = |depth: usize| {
        let input = format!(r#"{{"a":{}1{}}}"#, "[".repeat(depth), "]".repeat(depth));
        format!(
            r#"{{"role":"assistant","content":[{{"type":"tool_use","id":"t1","name":"echo","input":{input}}},{{"type":"tool_use","id":"t2","name":"calculator","input":{{"expression":"1+1"}}}}]}}"#
        )
    };
    let status = client
        .call_provider_tools(pb::CallProviderToolsRequest {
            provider: "anthropic".into(),
            message_json: nested(10_000),
            session_id: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("recursion limit"),
        "{}",
        status.message()
    );
    let (code, body) = http_post(
        addr,
        "/v1/anthropic/tool-calls",
        &[],
        nested(10_000).as_bytes(),
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["error"]["code"], "not_json");
    // ...and the control: moderately nested input runs, and the service still serves.
    let resp = client
        .call_provider_tools(pb::CallProviderToolsRequest {
            provider: "anthropic".into(),
            message_json: nested(50),
            session_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(resp.results.iter().all(|r| r.ok), "{:?}", resp.results);
    let (code, _) = http_post(addr, "/v1/anthropic/tool-calls", &[], nested(50).as_bytes()).await;
    assert_eq!(code, 200);
}
