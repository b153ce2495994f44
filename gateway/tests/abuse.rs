//! Load and abuse against a real `toolrun serve` process: the bound on requests open at
//! once (`--max-open-rpcs`) refuses with a typed RESOURCE_EXHAUSTED, not a crash, and frees
//! its slots when streams close; malformed and oversized requests on every front door
//! (gRPC, MCP `/mcp`, HTTP `/v1/{provider}/tool-calls`) each get their typed refusal, also
//! all at once, while a well-formed call still succeeds; the HTTP listener's bound
//! (`--max-open-http-requests`) refuses slow requests past it with `429`. The figures at scale are `toolrun
//! bench --abuse` (README "Security testing").

mod abuse_common;
mod raw_http;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use abuse_common::{
    Gw, MCP_INITIALIZE, calc, call_req, hold_http, http_post, still_held, until_429, until_served,
};
use bytes::{Buf, BufMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use toolrun_proto::v1 as pb;

async fn watch(
    c: &mut toolrun::cli::Client,
) -> Result<tonic::Streaming<pb::Approval>, tonic::Status> {
    c.watch_approvals(pb::WatchApprovalsRequest {
        session_id: String::new(),
    })
    .await
    .map(|r| r.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_max_open_rpcs_are_refused_typed_and_slots_come_back() {
    let gw = Gw::start(
        tempfile::tempdir().unwrap(),
        "{}",
        &["--max-open-rpcs", "64"],
    );
    let mut c = gw.client(None).await;
    let mut held = Vec::new();
    for i in 0..64 {
        held.push(
            watch(&mut c)
                .await
                .unwrap_or_else(|e| panic!("stream {i}: {e:?}")),
        );
    }
    let e = watch(&mut c)
        .await
        .expect_err("stream 65 is over the bound");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("--max-open-rpcs"), "{e:?}");
    assert_eq!(
        e.metadata()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    // A unary call at the bound: the same typed refusal, from another connection too.
    let mut other = gw.client(None).await;
    let e = other.call_tool(calc()).await.expect_err("at the bound");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    // Health still answers (load balancers see a full gateway as alive).
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
    assert_eq!(
        health.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    // Control: closing one stream frees its slot (the gateway sees the reset).
    held.pop();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match other.call_tool(calc()).await {
            Ok(r) => {
                assert!(r.into_inner().result.unwrap().ok);
                break;
            }
            Err(e) if e.code() == tonic::Code::ResourceExhausted => {
                assert!(Instant::now() < deadline, "the slot never came back");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    // Every held stream is still open: nothing was dropped to make room.
    for s in &mut held {
        let next = tokio::time::timeout(Duration::from_millis(5), s.message()).await;
        assert!(next.is_err(), "a held stream ended: {next:?}");
    }
    drop(held);
    assert!(
        gw.log_text().contains("--max-open-rpcs reached"),
        "the refusal is logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_requests_past_max_open_http_requests_get_429_and_grpc_is_unaffected() {
    let gw = Gw::start(
        tempfile::tempdir().unwrap(),
        "{}",
        &["--max-open-http-requests", "8"],
    );
    // Eight slow requests, half MCP and half the provider endpoint, each waiting for the
    // rest of its body.
    let mut held = Vec::new();
    for i in 0..8 {
        let path = if i % 2 == 0 {
            "/mcp"
        } else {
            "/v1/openai/tool-calls"
        };
        held.push(hold_http(gw.mcp, path, None).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The ninth: 429 with Retry-After, in each route's error shape.
    let (head, body) = until_429(gw.mcp, "/mcp", None).await;
    assert!(head.contains("retry-after: 1"), "{head}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["jsonrpc"], "2.0", "{body}");
    assert_eq!(v["error"]["code"], -32000, "{body}");
    assert_eq!(v["error"]["data"]["retry_after_ms"], 1000, "{body}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-open-http-requests"),
        "{body}"
    );
    let (status, head, body) = http_post(gw.mcp, "/v1/openai/tool-calls", None, "{}").await;
    assert_eq!(status, 429, "{body}");
    assert!(head.contains("retry-after: 1"), "{head}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "resource_exhausted", "{body}");
    // The eight were admitted and are still being received (none was refused).
    for s in &mut held {
        assert!(still_held(s).await, "a held request was answered");
    }
    // gRPC has its own bound: unaffected.
    let mut c = gw.client(None).await;
    let r = c.call_tool(calc()).await.unwrap();
    assert!(r.into_inner().result.unwrap().ok);
    // Control: one slow client goes away, its slot comes back and a request is served.
    drop(held.remove(0));
    let (status, body) = until_served(gw.mcp, "/mcp", None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("serverInfo"), "{body}");
    for s in &mut held {
        assert!(still_held(s).await, "a held request was answered");
    }
    drop(held);
    let (status, _, body) = http_post(gw.mcp, "/mcp", None, MCP_INITIALIZE).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        gw.log_text().contains("--max-open-http-requests reached"),
        "the refusal is logged"
    );
}

/// A gRPC codec of raw bytes: a request that is not protobuf.
#[derive(Clone, Copy, Default)]
struct Raw;
impl tonic::codec::Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}
impl tonic::codec::Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}
impl tonic::codec::Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// One HTTP/1.1 POST on the MCP listener: status and body. The gateway may answer 413
/// before reading it all (and close): not an error here.
async fn post(addr: SocketAddr, path: &str, body: &[u8]) -> (u16, String) {
    let head = raw_http::post_head(path, "", body.len());
    let r = raw_http::exchange(addr, &head, body, raw_http::Expect::MayCloseEarly).await;
    (r.status, r.text())
}

/// Junk on the gRPC port: the HTTP/2 frames the gateway sent back before closing.
async fn junk(addr: SocketAddr, preface: bool) -> Vec<(u8, Option<u32>)> {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut bytes = if preface {
        // A complete DATA frame on stream 0 where SETTINGS must come first.
        let mut b = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        b.extend([0, 0, 8, 0, 0, 0, 0, 0, 0]);
        b.extend([0xAA; 8]);
        b
    } else {
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()
    };
    bytes.extend((0..512u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    let _ = s.write_all(&bytes).await;
    let _ = s.shutdown().await;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf))
        .await
        .expect("the gateway closes the connection")
        .ok();
    let mut frames = Vec::new();
    let mut at = 0;
    while at + 9 <= buf.len() {
        let len = (usize::from(buf[at]) << 16)
            | (usize::from(buf[at + 1]) << 8)
            | usize::from(buf[at + 2]);
        let code = (buf[at + 3] == 7 && at + 17 <= buf.len())
            .then(|| u32::from_be_bytes(buf[at + 13..at + 17].try_into().unwrap()));
        frames.push((buf[at + 3], code));
        at += 9 + len;
    }
    frames
}

/// Every kind of bad request once, asserting its typed answer; `Err` names the first that
/// got something else.
async fn bad_requests(gw: &Gw, max: usize) -> Result<(), String> {
    let mut c = gw.client(None).await;
    let huge = format!(r#"{{"message":"{}"}}"#, "x".repeat(max));
    // gRPC: over --max-message-bytes.
    match c.call_tool(call_req("echo", &huge)).await {
        Err(e) if e.code() == tonic::Code::ResourceExhausted => {}
        other => return Err(format!("oversize: {:?}", other.map(|_| ()))),
    }
    // gRPC: not protobuf (a varint that never ends; a string that is not UTF-8).
    let channel = tonic::transport::Channel::from_shared(gw.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut raw = tonic::client::Grpc::new(channel);
    for payload in [vec![0xff; 64], vec![0x12, 0x04, 0xff, 0xfe, 0xfd, 0xfc]] {
        raw.ready().await.unwrap();
        let r = raw
            .unary(
                tonic::Request::new(payload),
                http::uri::PathAndQuery::from_static("/toolrun.v1.ToolService/CallTool"),
                Raw,
            )
            .await;
        match r {
            Err(e) if e.code() == tonic::Code::Internal && e.message().contains("decode") => {}
            other => return Err(format!("bad protobuf: {:?}", other.map(|_| ()))),
        }
    }
    // gRPC: arguments that are not JSON, a tool that does not exist: typed results.
    for (req, want) in [
        (
            call_req("calculator", r#"{"expression": "#),
            pb::ErrorCode::InvalidArguments,
        ),
        (call_req("no_such_tool", "{}"), pb::ErrorCode::UnknownTool),
    ] {
        let r = c.call_tool(req).await.map_err(|e| format!("{e:?}"))?;
        let code = r.into_inner().result.unwrap().error.map(|e| e.code);
        if code != Some(want as i32) {
            return Err(format!("want {want:?}, got {code:?}"));
        }
    }
    // Not HTTP/2: closed (h2 sends no GOAWAY before a preface); junk frames after a valid
    // preface: GOAWAY with an error code.
    let frames = junk(gw.grpc, false).await;
    if frames.iter().any(|f| f.0 == 7) {
        return Err(format!("no preface: {frames:?}"));
    }
    let frames = junk(gw.grpc, true).await;
    if !frames
        .iter()
        .any(|f| f.0 == 7 && f.1.is_some_and(|c| c != 0))
    {
        return Err(format!("junk frames: no GOAWAY with an error: {frames:?}"));
    }
    // MCP and the provider endpoint.
    for (path, body, status, needle) in [
        ("/mcp", huge.as_bytes(), 413, "-32600"),
        (
            "/mcp",
            br#"{"jsonrpc":"2.0","id":1,"method":"#.as_slice(),
            400,
            "-32700",
        ),
        (
            "/mcp",
            br#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#.as_slice(),
            400,
            "-32600",
        ),
        (
            "/v1/openai/tool-calls",
            huge.as_bytes(),
            413,
            "body_too_large",
        ),
        (
            "/v1/openai/tool-calls",
            b"{\"role\": \"assistant\", [".as_slice(),
            400,
            "not_json",
        ),
        (
            "/v1/nope/tool-calls",
            b"{}".as_slice(),
            404,
            "unknown_provider",
        ),
    ] {
        let (s, b) = post(gw.mcp, path, body).await;
        if s != status || !b.contains(needle) {
            return Err(format!(
                "{path}: {s} {b:.200} (want {status} with {needle})"
            ));
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_requests_get_typed_refusals_while_good_calls_pass() {
    // A small message limit keeps the oversized requests cheap.
    let max = 64 * 1024;
    let gw = Gw::start(
        tempfile::tempdir().unwrap(),
        "{}",
        &["--max-message-bytes", &max.to_string()],
    );
    // Each kind once.
    bad_requests(&gw, max).await.unwrap();
    // Control: just under the limit, the same gRPC and HTTP requests are served.
    let mut c = gw.client(None).await;
    let fits = format!(r#"{{"message":"{}"}}"#, "x".repeat(max - 1024));
    let r = c.call_tool(call_req("echo", &fits)).await.unwrap();
    assert!(r.into_inner().result.unwrap().ok);
    let (s, b) = post(
        gw.mcp,
        "/mcp",
        br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
    )
    .await;
    assert_eq!(s, 200, "{b}");

    // All at once, eight rounds each from eight callers, while a well-formed call goes on.
    let gw = std::sync::Arc::new(gw);
    let floods: Vec<_> = (0..8)
        .map(|_| {
            let gw = gw.clone();
            tokio::spawn(async move {
                for _ in 0..8 {
                    bad_requests(&gw, max).await?;
                }
                Ok::<_, String>(())
            })
        })
        .collect();
    let mut good = gw.client(None).await;
    let mut passed = 0;
    while floods.iter().any(|f| !f.is_finished()) {
        let r = good.call_tool(calc()).await.unwrap();
        assert!(r.into_inner().result.unwrap().ok);
        passed += 1;
    }
    for f in floods {
        f.await.unwrap().unwrap();
    }
    assert!(passed > 0, "no well-formed call ran during the flood");
    // The gateway is still the same process and serving.
    let r = good.call_tool(calc()).await.unwrap();
    assert!(r.into_inner().result.unwrap().ok);
}
