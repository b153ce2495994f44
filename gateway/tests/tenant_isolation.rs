//! Tenant isolation under load (issue "proof under attack"): a tenant flooding past its
//! calls per minute is refused with RESOURCE_EXHAUSTED and retry-after, while another
//! tenant's calls keep passing with their latency (p99 within 2x of its own unloaded p99,
//! measured in the same run, plus an absolute slack for a loaded 2-core CI machine). The
//! control: a second key of the flooding tenant, on its own connection, is refused too (the
//! limit is the tenant's, not the key's or the connection's), so the quiet tenant passes
//! because it is another tenant, not because nothing was limited.
//!
//! And a tenant holding all the gRPC requests its share allows (`limits.open_rpcs`) is
//! refused one more while another tenant is still served, up to the gateway's own bound;
//! likewise on the HTTP listener (`limits.open_http_requests`).

mod abuse_common;
mod raw_http;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use abuse_common::{
    Gw, MCP_INITIALIZE, calc, calc_latencies, create_key, hold_http, http_post, pct, still_held,
    until_429, until_served,
};

/// Burst and rate of the flooding tenant.
const CONFIG: &str = "\
auth:
  tenants:
    flood:
      limits: {calls_per_minute: 60, burst: 5}
    quiet: {}
";

/// Slack over 2x the unloaded p99: a CI machine with two cores runs the gateway, the
/// flooders and the measuring client together.
const SLACK: Duration = Duration::from_millis(50);

/// Each flooding caller's pace.
const PACE: Duration = Duration::from_millis(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_flooding_past_its_limit_is_refused_while_another_keeps_its_latency() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.yaml");
    let flood_key = create_key(&keys, "flood", "flood-1");
    let flood_key2 = create_key(&keys, "flood", "flood-2");
    let quiet_key = create_key(&keys, "quiet", "quiet-1");
    let gw = Gw::start(dir, CONFIG, &["--api-keys", keys.to_str().unwrap()]);

    let mut quiet = gw.client(Some(&quiet_key)).await;
    calc_latencies(&mut quiet, 50).await;
    let (alone, failed) = calc_latencies(&mut quiet, 300).await;
    assert!(failed.is_empty(), "quiet alone: {failed:?}");

    // The flood: four callers of tenant `flood`, each on its own connection, 100 calls a
    // second each (400 a second: 400 times the tenant's rate), never backing off on
    // retry-after. (`toolrun bench --abuse` also measures a closed loop, which saturates
    // the machine's cores rather than the tenant's limit.) They run on a runtime of
    // their own thread, so the quiet client's tasks are not queued behind theirs in this
    // process (they still share the machine's cores with it and the gateway).
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let other_answer = Arc::new(std::sync::Mutex::new(None::<String>));
    let start = Instant::now();
    let flood = {
        let (url, key) = (gw.url(), flood_key.clone());
        let (stop, counts, other_answer) = (stop.clone(), counts.clone(), other_answer.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut callers = Vec::new();
                for _ in 0..4 {
                    let mut c = toolrun::cli::connect(&url, Some(&key)).await.unwrap();
                    let (stop, counts, other_answer) =
                        (stop.clone(), counts.clone(), other_answer.clone());
                    callers.push(tokio::spawn(async move {
                        let mut pace = tokio::time::interval(PACE);
                        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                        while !stop.load(Ordering::Relaxed) {
                            pace.tick().await;
                            let i = match c.call_tool(calc()).await {
                                Ok(r) if r.get_ref().result.as_ref().is_some_and(|r| r.ok) => 0,
                                Err(e)
                                    if e.code() == tonic::Code::ResourceExhausted
                                        && e.metadata().get("retry-after").is_some() =>
                                {
                                    1
                                }
                                other => {
                                    *other_answer.lock().unwrap() = Some(format!("{other:?}"));
                                    2
                                }
                            };
                            counts[i].fetch_add(1, Ordering::Relaxed);
                        }
                    }));
                }
                for c in callers {
                    c.await.unwrap();
                }
            })
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (flooded, failed) = calc_latencies(&mut quiet, 300).await;

    // Control: the flooding tenant's other key, on a fresh connection, is refused as well.
    let mut flood2 = gw.client(Some(&flood_key2)).await;
    let control = flood2.call_tool(calc()).await;

    stop.store(true, Ordering::Relaxed);
    tokio::task::spawn_blocking(move || flood.join().unwrap())
        .await
        .unwrap();
    let secs = start.elapsed().as_secs_f64();
    let [ok, exhausted, other] = [0, 1, 2].map(|i| counts[i].load(Ordering::Relaxed));
    let (p50_0, p99_0, p50_1, p99_1) = (
        pct(&alone, 0.5),
        pct(&alone, 0.99),
        pct(&flooded, 0.5),
        pct(&flooded, 0.99),
    );
    println!(
        "flood: {ok} ok, {exhausted} RESOURCE_EXHAUSTED ({:.0}/s), {other} other in {secs:.1} s; \
         quiet calculator p50/p99 alone {p50_0}/{p99_0} us, flooded {p50_1}/{p99_1} us \
         ({:.2}x at p99)",
        exhausted as f64 / secs,
        p99_1 as f64 / p99_0.max(1) as f64
    );

    assert_eq!(
        other,
        0,
        "every refusal is RESOURCE_EXHAUSTED with retry-after: {:?}",
        other_answer.lock().unwrap()
    );
    assert!(exhausted > 0, "the flood went past the limit");
    // The burst, then one a second (60 a minute), and one of slack for the refill's edge.
    let allowed = 5 + secs.ceil() as u64 + 1;
    assert!(
        ok <= allowed,
        "{ok} calls passed, more than the burst and rate allow ({allowed})"
    );
    let e = control.expect_err("the flooding tenant's other key is over the same limit");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("calls per minute"), "{e:?}");
    assert!(failed.is_empty(), "quiet was refused or failed: {failed:?}");
    let bound = 2 * p99_0 + SLACK.as_micros() as u64;
    assert!(
        p99_1 <= bound,
        "quiet's p99 under the flood ({p99_1} us) exceeds 2x its unloaded p99 + {SLACK:?} \
         ({bound} us)"
    );
}

/// Tenant `holder`'s share of the gateway's open gRPC requests; `--max-open-rpcs` is 12.
const SHARES: &str = "\
auth:
  tenants:
    holder:
      limits: {open_rpcs: 8, open_http_requests: 2}
    other: {}
";

async fn watch(
    c: &mut toolrun::cli::Client,
) -> Result<tonic::Streaming<toolrun_proto::v1::Approval>, tonic::Status> {
    c.watch_approvals(toolrun_proto::v1::WatchApprovalsRequest {
        session_id: String::new(),
    })
    .await
    .map(|r| r.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_holding_its_share_of_open_rpcs_leaves_the_others_served() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.yaml");
    let holder_key = create_key(&keys, "holder", "holder-1");
    let other_key = create_key(&keys, "other", "other-1");
    let gw = Gw::start(
        dir,
        SHARES,
        &[
            "--api-keys",
            keys.to_str().unwrap(),
            "--max-open-rpcs",
            "12",
        ],
    );
    // The holder's streams over two connections: the share is the tenant's, not a
    // connection's.
    let mut h1 = gw.client(Some(&holder_key)).await;
    let mut h2 = gw.client(Some(&holder_key)).await;
    let mut held = Vec::new();
    for i in 0..8 {
        let c = if i % 2 == 0 { &mut h1 } else { &mut h2 };
        held.push(
            watch(c)
                .await
                .unwrap_or_else(|e| panic!("holder's stream {i}: {e:?}")),
        );
    }
    let e = watch(&mut h1)
        .await
        .expect_err("the holder's ninth stream is over its share");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("tenant \"holder\"") && e.message().contains("limits.open_rpcs"),
        "{e:?}"
    );
    assert_eq!(
        e.metadata()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    // A unary call counts as well.
    let e = h2
        .call_tool(calc())
        .await
        .expect_err("at the holder's share");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("limits.open_rpcs"), "{e:?}");

    // The other tenant is served: calls, and streams up to what is left of the gateway's
    // bound (12 - 8).
    let mut other = gw.client(Some(&other_key)).await;
    let r = other.call_tool(calc()).await.expect("other's call");
    assert!(r.into_inner().result.unwrap().ok);
    let mut others = Vec::new();
    for i in 0..4 {
        others.push(
            watch(&mut other)
                .await
                .unwrap_or_else(|e| panic!("other's stream {i}: {e:?}")),
        );
    }
    // Control: the gateway's bound is still there, and is not the holder's share.
    let e = watch(&mut other)
        .await
        .expect_err("the gateway's bound is reached");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("--max-open-rpcs"), "{e:?}");
    drop(others);

    // Once the holder closes one stream, it is served again.
    held.pop();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut again = loop {
        match watch(&mut h1).await {
            Ok(s) => break s,
            Err(e) if e.code() == tonic::Code::ResourceExhausted => {
                assert!(
                    Instant::now() < deadline,
                    "the holder's slot never came back"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    };
    // Every stream the holder kept is still open: nothing was dropped to make room.
    for s in held.iter_mut().chain(std::iter::once(&mut again)) {
        let next = tokio::time::timeout(Duration::from_millis(5), s.message()).await;
        assert!(next.is_err(), "a held stream ended: {next:?}");
    }
    // And its unary calls, once the streams are gone (the gateway sees each reset).
    drop((held, again));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match h2.call_tool(calc()).await {
            Ok(r) => break assert!(r.into_inner().result.unwrap().ok),
            Err(e) if e.code() == tonic::Code::ResourceExhausted => {
                assert!(
                    Instant::now() < deadline,
                    "the holder's slots never came back"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(
        gw.log_text().contains("tenant's open requests"),
        "the refusal is logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_holding_its_share_of_http_requests_leaves_the_others_served() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.yaml");
    let holder_key = create_key(&keys, "holder", "holder-1");
    let other_key = create_key(&keys, "other", "other-1");
    let gw = Gw::start(
        dir,
        SHARES,
        &[
            "--api-keys",
            keys.to_str().unwrap(),
            "--max-open-http-requests",
            "12",
        ],
    );
    let (h, o) = (Some(holder_key.as_str()), Some(other_key.as_str()));
    let mut held = vec![
        hold_http(gw.mcp, "/mcp", h).await,
        hold_http(gw.mcp, "/v1/openai/tool-calls", h).await,
    ];
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (head, body) = until_429(gw.mcp, "/mcp", h).await;
    assert!(head.contains("retry-after: 1"), "{head}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("tenant \"holder\"") && message.contains("limits.open_http_requests"),
        "{body}"
    );
    let (status, _, body) = http_post(gw.mcp, "/v1/openai/tool-calls", h, "{}").await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("limits.open_http_requests"), "{body}");
    // The other tenant is served, over HTTP (MCP and a provider message) and gRPC.
    let (status, _, body) = http_post(gw.mcp, "/mcp", o, MCP_INITIALIZE).await;
    assert_eq!(status, 200, "{body}");
    let message = r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"calculator","arguments":"{\"expression\":\"6*7\"}"}}]}"#;
    let (status, _, body) = http_post(gw.mcp, "/v1/openai/tool-calls", o, message).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("42"), "{body}");
    let mut other = gw.client(Some(&other_key)).await;
    assert!(
        other
            .call_tool(calc())
            .await
            .unwrap()
            .into_inner()
            .result
            .unwrap()
            .ok
    );
    // The holder's gRPC is not its HTTP share.
    let mut holder = gw.client(Some(&holder_key)).await;
    assert!(
        holder
            .call_tool(calc())
            .await
            .unwrap()
            .into_inner()
            .result
            .unwrap()
            .ok
    );
    for s in &mut held {
        assert!(still_held(s).await, "a held request was answered");
    }
    // Once the holder lets one go, it is served again.
    drop(held.remove(0));
    let (status, body) = until_served(gw.mcp, "/mcp", h).await;
    assert_eq!(status, 200, "{body}");
    assert!(still_held(&mut held[0]).await);
}

/// Two tenants with no limits of their own: each gets its default share of the server's
/// bounds (`auth.tenant_share_percent`, 50% unless `percent` says otherwise).
fn two_tenants(percent: Option<u8>) -> String {
    let share = percent.map_or(String::new(), |p| format!("  tenant_share_percent: {p}\n"));
    format!("auth:\n{share}  tenants:\n    a: {{}}\n    b: {{}}\n")
}

/// What tenant `b` gets while tenant `a`, with no limits of its own, holds every gRPC
/// stream and HTTP request it is let open, on a gateway bounded at 8 of each.
struct Flooded {
    /// Streams and HTTP requests `a` got open.
    a_streams: usize,
    a_http: usize,
    /// `a`'s refusals (gRPC message, HTTP body).
    a_refused: (String, String),
    /// `b`'s gRPC call and HTTP request meanwhile: ok, or the refusal.
    b_call: Result<(), tonic::Status>,
    b_http: (u16, String),
}

async fn flood_without_limits(percent: Option<u8>) -> Flooded {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.yaml");
    let a_key = create_key(&keys, "a", "a-1");
    let b_key = create_key(&keys, "b", "b-1");
    let gw = Gw::start(
        dir,
        &two_tenants(percent),
        &[
            "--api-keys",
            keys.to_str().unwrap(),
            "--max-open-rpcs",
            "8",
            "--max-open-http-requests",
            "8",
        ],
    );
    // gRPC: `a` opens streams over two connections until refused.
    let mut a1 = gw.client(Some(&a_key)).await;
    let mut a2 = gw.client(Some(&a_key)).await;
    let mut held = Vec::new();
    let a_grpc_refusal = loop {
        let c = if held.len() % 2 == 0 {
            &mut a1
        } else {
            &mut a2
        };
        match watch(c).await {
            Ok(s) => held.push(s),
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
                assert!(e.metadata().get("retry-after").is_some(), "{e:?}");
                break e.message().to_string();
            }
        }
        assert!(held.len() <= 8, "more streams than --max-open-rpcs");
    };
    // HTTP: `a` holds slow requests until refused (each admitted before the next probe).
    let mut held_http = Vec::new();
    let a_http_refusal = loop {
        held_http.push(hold_http(gw.mcp, "/mcp", Some(&a_key)).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (status, head, body) = http_post(gw.mcp, "/mcp", Some(&a_key), MCP_INITIALIZE).await;
        if status == 429 {
            assert!(head.contains("retry-after: 1"), "{head}");
            break body;
        }
        assert_eq!(status, 200, "{body}");
        assert!(
            held_http.len() <= 8,
            "more requests than --max-open-http-requests"
        );
    };
    // Count what `a` really holds: the last probe may have lost the race to a slot that
    // was still being taken.
    let a_http = held_http.len();

    let mut b = gw.client(Some(&b_key)).await;
    let b_call = match b.call_tool(calc()).await {
        Ok(r) => {
            assert!(r.into_inner().result.unwrap().ok);
            Ok(())
        }
        Err(e) => Err(e),
    };
    let (status, _, body) = http_post(gw.mcp, "/mcp", Some(&b_key), MCP_INITIALIZE).await;
    for s in &mut held_http {
        assert!(still_held(s).await, "a held request of a was answered");
    }
    Flooded {
        a_streams: held.len(),
        a_http,
        a_refused: (a_grpc_refusal, a_http_refusal),
        b_call,
        b_http: (status, body),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_limits_of_its_own_a_tenant_holds_only_its_default_share() {
    // Default share (50%): `a` holds 4 of the 8 streams and 4 of the 8 HTTP requests, is
    // refused past them, saying it is its default share, and `b` is served.
    let f = flood_without_limits(None).await;
    assert_eq!((f.a_streams, f.a_http), (4, 4));
    let (grpc, http) = &f.a_refused;
    for text in [grpc, http] {
        assert!(
            text.contains("tenant \\\"a\\\"") || text.contains("tenant \"a\""),
            "{text}"
        );
        assert!(
            text.contains("default share: auth.tenant_share_percent 50%"),
            "{text}"
        );
    }
    assert!(grpc.contains("limits.open_rpcs of 4"), "{grpc}");
    assert!(http.contains("limits.open_http_requests of 4"), "{http}");
    f.b_call.expect("b's call while a holds its share");
    assert_eq!(f.b_http.0, 200, "{}", f.b_http.1);

    // Control: the same flood with a share of 100% fills the gateway's bounds, and `b`
    // is refused on both front doors: the share is what kept it served.
    let f = flood_without_limits(Some(100)).await;
    assert_eq!((f.a_streams, f.a_http), (8, 8));
    assert!(
        f.a_refused.0.contains("--max-open-rpcs"),
        "{:?}",
        f.a_refused
    );
    assert!(
        f.a_refused.1.contains("--max-open-http-requests"),
        "{:?}",
        f.a_refused
    );
    let e = f.b_call.expect_err("b is starved at a share of 100%");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("--max-open-rpcs"), "{e:?}");
    assert_eq!(f.b_http.0, 429, "{}", f.b_http.1);
    assert!(
        f.b_http.1.contains("--max-open-http-requests"),
        "{}",
        f.b_http.1
    );
}
