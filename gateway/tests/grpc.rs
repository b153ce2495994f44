//! The gRPC contract over a real tonic server on an ephemeral loopback port, with the
//! inline tools (the sandboxed tools have their own suites).

use std::time::Duration;

use serde_json::Value;
use tonic::Code;
use toolrun::serve::{Running, ServeArgs, start};
use toolrun_proto::v1 as pb;
use toolrun_proto::v1::tool_service_client::ToolServiceClient;

async fn server_with(
    config: Option<&str>,
) -> (Running, ToolServiceClient<tonic::transport::Channel>) {
    // Read once at startup; the file goes when this function returns.
    let config_file = config.map(|text| {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    });
    let running = start(ServeArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        config: config_file.as_ref().map(|f| f.path().to_path_buf()),
        no_sandbox: true,
        max_message_bytes: 256 * 1024,
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

async fn server() -> (Running, ToolServiceClient<tonic::transport::Channel>) {
    server_with(None).await
}

fn call(tool: &str, args: &str) -> pb::CallToolRequest {
    pb::CallToolRequest {
        call_id: format!("id-{tool}"),
        tool: tool.into(),
        arguments_json: args.into(),
        timeout_ms: 0,
        session_id: String::new(),
    }
}

async fn call_one(
    client: &mut ToolServiceClient<tonic::transport::Channel>,
    tool: &str,
    args: &str,
) -> pb::ToolResult {
    client
        .call_tool(call(tool, args))
        .await
        .expect("rpc ok")
        .into_inner()
        .result
        .expect("result present")
}

fn code(r: &pb::ToolResult) -> pb::ErrorCode {
    pb::ErrorCode::try_from(r.error.as_ref().expect("error present").code).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_tools_has_schemas_and_provider_forms() {
    let (_s, mut client) = server().await;
    let tools = client
        .list_tools(pb::ListToolsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .tools;
    let ids: Vec<&str> = tools.iter().map(|t| t.id.as_str()).collect();
    assert!(
        ids.contains(&"calculator") && ids.contains(&"echo") && ids.contains(&"hash"),
        "{ids:?}"
    );
    for t in &tools {
        let schema: Value = serde_json::from_str(&t.input_schema_json).unwrap();
        assert_eq!(schema["type"], "object", "{}: {schema}", t.id);
        let _: Value = serde_json::from_str(&t.output_schema_json).unwrap();
        assert!(semver_like(&t.version), "{}", t.version);
        assert!(t.timeout_ms >= 100);
        assert!(t.rendered_json.is_empty());
    }
    for (format, check) in [
        (pb::ToolFormat::Openai, "/function/parameters"),
        (pb::ToolFormat::Anthropic, "/input_schema"),
        (pb::ToolFormat::Mcp, "/inputSchema"),
    ] {
        let tools = client
            .list_tools(pb::ListToolsRequest {
                format: format as i32,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .tools;
        for t in tools {
            let v: Value = serde_json::from_str(&t.rendered_json).unwrap();
            assert_eq!(
                v.pointer(check).unwrap()["type"],
                "object",
                "{format:?} {v}"
            );
        }
    }
}

fn semver_like(v: &str) -> bool {
    let parts: Vec<&str> = v.split('.').collect();
    parts.len() == 3 && parts.iter().all(|p| p.parse::<u64>().is_ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_round_trips_with_canonical_output_and_hash() {
    let (_s, mut client) = server().await;
    let r = call_one(
        &mut client,
        "echo",
        r#"{ "z": 1, "a": {"y": [1, 2.0, "x"]} }"#,
    )
    .await;
    assert!(r.ok, "{r:?}");
    assert_eq!(r.call_id, "id-echo");
    assert_eq!(r.output_json, r#"{"a":{"y":[1,2,"x"]},"z":1}"#);
    assert_eq!(
        r.output_hash,
        blake3::hash(r.output_json.as_bytes()).to_hex().to_string()
    );
    assert!(r.duration_us > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calculator_and_hash_over_grpc() {
    let (_s, mut client) = server().await;
    let r = call_one(&mut client, "calculator", r#"{"expression":"2 + 2"}"#).await;
    assert!(r.ok, "{r:?}");
    let out: Value = serde_json::from_str(&r.output_json).unwrap();
    assert_eq!(out["value"].as_f64(), Some(4.0));
    assert_eq!(out["formatted"], "4");
    let r = call_one(&mut client, "calculator", r#"{"expression":"1 / 0"}"#).await;
    assert_eq!(code(&r), pb::ErrorCode::DivisionByZero);
    let r = call_one(&mut client, "hash", r#"{"input":"abc"}"#).await;
    let out: Value = serde_json::from_str(&r.output_json).unwrap();
    assert_eq!(out["hash"], blake3::hash(b"abc").to_hex().to_string());
    assert_eq!(out["algorithm"], "blake3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_are_typed_results_and_server_keeps_serving() {
    let (_s, mut client) = server().await;
    let r = call_one(&mut client, "calculator", "not json").await;
    assert!(!r.ok);
    assert_eq!(code(&r), pb::ErrorCode::InvalidArguments);
    let r = call_one(&mut client, "calculator", "[1,2]").await;
    assert_eq!(code(&r), pb::ErrorCode::InvalidArguments);
    assert!(r.error.unwrap().message.contains("object"));
    let r = call_one(&mut client, "calculator", r#"{"expression": 5}"#).await;
    let e = r.error.unwrap();
    assert!(e.message.contains("/expression"), "{}", e.message);
    let details: Value = serde_json::from_str(&e.details_json).unwrap();
    assert_eq!(details["errors"][0]["path"], "/expression");
    let r = call_one(
        &mut client,
        "calculator",
        r#"{"expression": "1", "extra": 1}"#,
    )
    .await;
    assert_eq!(code(&r), pb::ErrorCode::InvalidArguments);
    let r = call_one(&mut client, "no_such_tool", "{}").await;
    assert_eq!(code(&r), pb::ErrorCode::UnknownTool);
    assert_eq!(r.tool, "no_such_tool");
    // Still serving.
    assert!(call_one(&mut client, "echo", "{}").await.ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_tool_is_hidden_and_refused() {
    let (_s, mut client) = server_with(Some("tools:\n  hash:\n    enabled: false\n")).await;
    let tools = client
        .list_tools(pb::ListToolsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .tools;
    assert!(!tools.iter().any(|t| t.id == "hash"));
    let r = call_one(&mut client, "hash", r#"{"input":"x"}"#).await;
    assert_eq!(code(&r), pb::ErrorCode::ToolDisabled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_config_names_the_key() {
    let err = start_error("tools:\n  calculator:\n    timeout_ms: 999999\n").await;
    assert!(err.contains("tools.calculator.timeout_ms"), "{err}");
    let err = start_error("tools:\n  calculater: {}\n").await;
    assert!(err.contains("calculater"), "{err}");
}

/// The startup error of a gateway given `config`.
async fn start_error(config: &str) -> String {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), config).unwrap();
    start(ServeArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        config: Some(f.path().to_path_buf()),
        no_sandbox: true,
        ..ServeArgs::default()
    })
    .await
    .err()
    .expect("startup fails")
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_tools_returns_results_in_request_order() {
    let (_s, mut client) = server().await;
    let calls: Vec<pb::CallToolRequest> = (0..50)
        .map(|i| pb::CallToolRequest {
            call_id: format!("c{i}"),
            tool: if i % 3 == 0 { "echo" } else { "calculator" }.into(),
            arguments_json: if i % 3 == 0 {
                format!(r#"{{"i":{i}}}"#)
            } else {
                format!(r#"{{"expression":"{i} * 2"}}"#)
            },
            timeout_ms: 0,
            // No session: a session id must name an open session (SESSION_NOT_FOUND).
            session_id: String::new(),
        })
        .collect();
    let results = client
        .call_tools(pb::CallToolsRequest { calls })
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(results.len(), 50);
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r.call_id, format!("c{i}"));
        assert!(r.ok, "{r:?}");
        let out: Value = serde_json::from_str(&r.output_json).unwrap();
        if i % 3 == 0 {
            assert_eq!(out["i"], i);
        } else {
            assert_eq!(out["value"], (i * 2) as f64);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_batch_and_message_are_resource_exhausted() {
    let (_s, mut client) = server().await;
    let calls = vec![call("echo", "{}"); toolrun::grpc::MAX_BATCH + 1];
    let err = client
        .call_tools(pb::CallToolsRequest { calls })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    // The server under test accepts 256 KiB messages.
    let big = format!(r#"{{"x":"{}"}}"#, "a".repeat(512 * 1024));
    let err = client.call_tool(call("echo", &big)).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert!(call_one(&mut client, "echo", "{}").await.ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_deadline_times_out_and_server_survives() {
    let (s, mut client) = server().await;
    // A zero deadline must reach the server as sent: tonic's client enforces a grpc-timeout
    // header itself (answering CANCELLED "Timeout expired" on its own side), and curl 7.88
    // reports an error without headers when the server resets the stream after answering,
    // which HTTP/2 allows. So the call goes over a bare HTTP/2 connection (h2, the crate
    // under tonic), and the test reads the server's grpc-status itself: 4
    // (DEADLINE_EXCEEDED), every time (repeated: whether the request's body has arrived when
    // the server first looks at the call varies from call to call).
    let tcp = tokio::net::TcpStream::connect(s.grpc_addr).await.unwrap();
    let (h2, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut h2 = h2.ready().await.unwrap();
    let body = {
        let msg = prost::Message::encode_to_vec(&call("echo", "{}"));
        let mut b = vec![0u8];
        b.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        b.extend_from_slice(&msg);
        b
    };
    let mut statuses = Vec::new();
    for _ in 0..20 {
        let req = http::Request::builder()
            .method("POST")
            .uri(format!(
                "http://{}/toolrun.v1.ToolService/CallTool",
                s.grpc_addr
            ))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("grpc-timeout", "0n")
            .body(())
            .unwrap();
        let (resp, mut send) = h2.send_request(req, false).unwrap();
        // The server may answer (and reset the stream) before the body is sent.
        let _ = send.send_data(bytes::Bytes::from(body.clone()), true);
        let resp = tokio::time::timeout(std::time::Duration::from_secs(5), resp)
            .await
            .expect("an answer within 5 s")
            .expect("a response, not a transport error");
        // Trailers-only answers carry grpc-status in the headers; otherwise in the trailers.
        let mut status = resp
            .headers()
            .get("grpc-status")
            .map(|v| v.to_str().unwrap().to_string());
        if status.is_none() {
            let mut body = resp.into_body();
            while let Some(chunk) = body.data().await {
                let _ = chunk;
            }
            status = body.trailers().await.ok().flatten().and_then(|t| {
                t.get("grpc-status")
                    .map(|v| v.to_str().unwrap().to_string())
            });
        }
        statuses.push(status.unwrap_or_else(|| "none".into()));
        h2 = h2.ready().await.unwrap();
    }
    let wrong: Vec<&String> = statuses.iter().filter(|st| *st != "4").collect();
    assert!(
        wrong.is_empty(),
        "{} of 20 zero-deadline calls not DEADLINE_EXCEEDED (grpc-status 4): {wrong:?}",
        wrong.len()
    );
    // Control: the same call without the zero deadline runs, and the server still serves.
    assert!(call_one(&mut client, "echo", "{}").await.ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_concurrent_calls_all_answered() {
    let (_s, client) = server().await;
    let mut tasks = Vec::new();
    for i in 0..2000 {
        let mut c = client.clone();
        tasks.push(tokio::spawn(async move {
            c.call_tool(call("calculator", &format!(r#"{{"expression":"{i}+1"}}"#)))
                .await
        }));
    }
    let mut ok = 0;
    for t in tasks {
        if let Ok(resp) = t.await.unwrap()
            && resp.into_inner().result.unwrap().ok
        {
            ok += 1;
        }
    }
    assert_eq!(ok, 2000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_protobuf_is_a_status_not_a_crash() {
    let (s, mut client) = server().await;
    // A gRPC frame whose payload is not a valid CallToolRequest.
    let headers = curl_grpc(
        s.grpc_addr,
        &[0xff, 0xff, 0xff, 0xff, 0x0f, 0x0a, 0x80],
        &[],
    );
    assert!(headers.contains("grpc-status"), "{headers}");
    assert!(!headers.contains("grpc-status: 0"), "{headers}");
    assert!(call_one(&mut client, "echo", "{}").await.ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reflection_and_admin_endpoints() {
    let (s, _client) = server().await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", s.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "toolrun.v1.ToolService".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    let mut reflection =
        tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient::new(channel);
    let req = tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            tonic_reflection::pb::v1::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            ),
        ),
    };
    let mut stream = reflection
        .server_reflection_info(futures::stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner();
    let resp = stream.message().await.unwrap().unwrap();
    let text = format!("{resp:?}");
    assert!(text.contains("toolrun.v1.ToolService"), "{text}");
    assert!(text.contains("grpc.health.v1.Health"), "{text}");

    let admin = format!("http://{}", s.admin_addr);
    let get = |path: &str| {
        let out = std::process::Command::new("curl")
            .args(["-s", "-w", "\n%{http_code}", &format!("{admin}{path}")])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(get("/healthz").ends_with("200"));
    let ready = get("/readyz");
    assert!(ready.ends_with("200"), "{ready}");
    let metrics = get("/metrics");
    assert!(metrics.contains("toolrun_sandbox_inflight"), "{metrics}");

    // Shutdown: health turns NOT_SERVING / the listener closes, and the server stops.
    s.shutdown();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let r = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await;
        let serving = matches!(r, Ok(ref resp) if resp.get_ref().status
            == tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
        if !serving {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "health still SERVING after shutdown"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::timeout(Duration::from_secs(15), s.wait())
        .await
        .expect("server stops")
        .expect("clean stop");
}

/// Sends one gRPC frame with `payload` to CallTool with curl (a client that does no checking
/// of its own) and returns the response headers and trailers as text.
fn curl_grpc(addr: std::net::SocketAddr, payload: &[u8], extra_headers: &[&str]) -> String {
    use std::io::Write;
    let mut body = vec![0u8];
    body.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    body.extend_from_slice(payload);
    let mut args: Vec<String> = [
        "-s",
        "--http2-prior-knowledge",
        "-o",
        "/dev/null",
        "-D",
        "-",
        "-H",
        "content-type: application/grpc",
        "-H",
        "te: trailers",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for h in extra_headers {
        args.push("-H".into());
        args.push(h.to_string());
    }
    args.push("--data-binary".into());
    args.push("@-".into());
    args.push(format!("http://{addr}/toolrun.v1.ToolService/CallTool"));
    let mut child = std::process::Command::new("curl")
        .args(&args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("curl runs");
    child.stdin.take().unwrap().write_all(&body).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn example_config_is_valid_and_matches_the_defaults() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../toolrun.example.yaml");
    let config = toolrun::config::Config::load(std::path::Path::new(path)).expect("example loads");
    assert_eq!(config.sandbox, toolrun::config::SandboxConfig::default());
}
