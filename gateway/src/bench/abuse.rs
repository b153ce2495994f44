//! `toolrun bench --abuse`: load and abuse against `toolrun serve` child processes on this
//! machine (the local backend), each scenario beside its unloaded baseline measured in the
//! same run, with the gateway's resident memory (VmRSS, VmHWM of the child) before, at the
//! peak and after.
//!
//! - `streams`: `--abuse-streams` (10,000) WatchApprovals streams held open over several
//!   HTTP/2 connections (1,000 per connection, under `--max-concurrent-streams`).
//!   WatchApprovals is the cheapest stream the gateway really holds: a task and a broadcast
//!   receiver, no sandbox, until the client goes away (a StreamTool call would need a
//!   sandbox or a session and an approval per stream). Then: calculator latency while they
//!   are held beside idle, the bound (`--max-open-rpcs`): streams opened until it refuses,
//!   and what a call gets there; and the memory given back once they close.
//! - `http`: slow requests on the HTTP listener (half MCP `/mcp`, half the provider
//!   endpoint, each announcing a body and sending a few bytes of it) held up to its bound
//!   (`--max-open-http-requests`): the memory they take, what the next requests get (429),
//!   gRPC calls meanwhile, and MCP `initialize` latency before and after.
//! - `flood`: malformed and oversized requests on every front door (gRPC, MCP `/mcp`, HTTP
//!   `/v1/{provider}/tool-calls`), each checked for its typed refusal, while one client's
//!   well-formed calculator calls are timed beside the same calls unloaded.
//! - `tenants`: tenant `flood` hammers calculator and run_code past its calls per minute
//!   and runs in flight; tenant `quiet`'s calculator and run_code latencies beside its own
//!   unloaded ones.
//! - `shares`: two tenants without limits of their own at `--abuse-max-open-rpcs`: tenant
//!   `a` opens streams until refused (its default share, `auth.tenant_share_percent`),
//!   tenant `b`'s calculator latency beside its own before, and the streams `b` still
//!   opens; the control: the same at a share of 100%, where `a` fills the bound and `b` is
//!   refused.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes};
use serde_json::{Value, json};
use toolrun_proto::v1 as pb;

use super::{BenchArgs, Report, print_report, report, rss_kib, sample_rss};
use crate::cli::{CliError, Client, connect};

/// Streams per HTTP/2 connection (the gateway's default `--max-concurrent-streams` is 1024).
const STREAMS_PER_CONNECTION: usize = 1000;

/// Sequential well-formed calls per latency sample.
const LATENCY_CALLS: usize = 500;

fn usage(e: impl std::fmt::Display) -> CliError {
    CliError::Usage(e.to_string())
}

/// A `toolrun serve` child on loopback ephemeral ports, stopped with SIGTERM on drop.
struct Gateway {
    child: Child,
    pid: u32,
    grpc: SocketAddr,
    mcp: SocketAddr,
    dir: PathBuf,
}

impl Gateway {
    /// Starts this executable's `serve` with `config` (YAML) and `extra` flags.
    async fn start(
        name: &str,
        config: &str,
        extra: &[String],
        sandbox: bool,
    ) -> Result<Gateway, CliError> {
        let dir =
            std::env::temp_dir().join(format!("toolrun-bench-abuse-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let cfg = dir.join("toolrun.yaml");
        std::fs::write(&cfg, config)?;
        let log = dir.join("gateway.log");
        let exe = std::env::current_exe()?;
        let mut cmd = Command::new(exe);
        cmd.args(["--log-format", "json", "serve"])
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .args(["--mcp-listen", "127.0.0.1:0", "--drain-timeout-ms", "1000"])
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--config")
            .arg(&cfg)
            .args(extra)
            .env_remove("TOOLRUN_API_KEYS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?);
        if !sandbox {
            cmd.arg("--no-sandbox");
        }
        let mut child = cmd.spawn()?;
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(line) = text.lines().find(|l| l.contains("\"toolrun serving\"")) {
                let v: Value = serde_json::from_str(line).map_err(usage)?;
                let addr = |k: &str| -> Option<SocketAddr> {
                    v[k].as_str()?
                        .trim_start_matches("Some(")
                        .trim_end_matches(')')
                        .parse()
                        .ok()
                };
                let (Some(grpc), Some(mcp)) = (addr("grpc"), addr("mcp")) else {
                    return Err(usage(format!("no addresses in {line}")));
                };
                return Ok(Gateway {
                    child,
                    pid,
                    grpc,
                    mcp,
                    dir,
                });
            }
            if let Some(status) = child.try_wait()? {
                return Err(usage(format!("the gateway exited {status}:\n{text}")));
            }
            if Instant::now() > deadline {
                return Err(usage(format!("the gateway did not start:\n{text}")));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    fn rss(&self) -> u64 {
        rss_kib(self.pid).unwrap_or(0)
    }

    /// The peak resident memory since start (VmHWM), KiB.
    fn hwm(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmHWM:"))?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.pid as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Prints one measured fact (a JSON line with `--json`).
fn fact(json_out: bool, v: Value) {
    if json_out {
        println!("{v}");
    } else {
        let Value::Object(m) = v else { return };
        let line: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!("  {}", line.join(" "));
    }
}

fn call_req(tool: &str, args: &str) -> pb::CallToolRequest {
    pb::CallToolRequest {
        call_id: String::new(),
        tool: tool.into(),
        arguments_json: args.into(),
        timeout_ms: 0,
        session_id: String::new(),
    }
}

const CALC: &str = r#"{"expression":"2 + 3 * sqrt(16)"}"#;
const PRINT1: &str = r#"{"language":"python","code":"print(1)"}"#;

/// `n` sequential calls of `tool`: latencies (µs) and the calls that did not return ok.
async fn latencies(client: &mut Client, tool: &str, args: &str, n: usize) -> (Vec<u64>, usize) {
    let mut lat = Vec::with_capacity(n);
    let mut failures = 0;
    for _ in 0..n {
        let t = Instant::now();
        let r = client.call_tool(call_req(tool, args)).await;
        lat.push(t.elapsed().as_micros() as u64);
        let ok = matches!(&r, Ok(resp) if resp.get_ref().result.as_ref().is_some_and(|r| r.ok));
        if !ok && failures == 0 {
            eprintln!("{tool}: {r:?}");
        }
        failures += usize::from(!ok);
    }
    (lat, failures)
}

fn timed(name: &str, (lat, failures): (Vec<u64>, usize), wall: Duration) -> Report {
    report(name, 1, lat, failures, wall)
}

/// The pace of one of `callers` sharing `rate` requests per second: `None` (rate 0) is a
/// closed loop, each caller sending its next request as soon as the last is answered.
fn pacer(rate: f64, callers: usize) -> Option<tokio::time::Interval> {
    (rate > 0.0).then(|| {
        let mut i = tokio::time::interval(Duration::from_secs_f64(callers as f64 / rate));
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        i
    })
}

/// Raises this process's open-files limit to its hard limit (a bench that holds many
/// connections).
fn raise_nofile() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut l = getrlimit(Resource::Nofile);
    if l.current < l.maximum {
        l.current = l.maximum;
        let _ = setrlimit(Resource::Nofile, l);
    }
}

/// Runs the abuse scenarios named by `--abuse-scenarios`.
pub async fn run(args: &BenchArgs) -> Result<(), CliError> {
    raise_nofile();
    if args.addr.is_some() {
        eprintln!(
            "--abuse starts its own gateways (it needs their pids, flags and tenants); --addr is ignored"
        );
    }
    if !args.json {
        println!(
            "{:<28} {:>4} {:>9} {:>6} {:>12} {:>10} {:>10}",
            "SCENARIO", "CONC", "CALLS", "FAILS", "CALLS/S", "P50_US", "P99_US"
        );
    }
    for s in &args.abuse_scenarios {
        match s.as_str() {
            "streams" => streams(args).await?,
            "http" => http_held(args).await?,
            "flood" => flood(args).await?,
            "tenants" => tenants(args).await?,
            "shares" => {
                shares(args, None).await?;
                shares(args, Some(100)).await?;
            }
            other => {
                return Err(usage(format!(
                    "--abuse-scenarios: {other:?} is none of streams, http, flood, tenants, \
                     shares"
                )));
            }
        }
    }
    Ok(())
}

/// Opens `n` WatchApprovals streams round-robin over `clients`: the held streams and the
/// refusals by gRPC code.
async fn open_streams(
    clients: &[Client],
    n: usize,
) -> (
    Vec<tonic::Streaming<pb::Approval>>,
    std::collections::BTreeMap<String, usize>,
) {
    let opens = (0..n).map(|i| {
        let mut c = clients[i % clients.len()].clone();
        async move {
            c.watch_approvals(pb::WatchApprovalsRequest {
                session_id: String::new(),
            })
            .await
        }
    });
    let mut held = Vec::with_capacity(n);
    let mut refused = std::collections::BTreeMap::new();
    for r in futures::future::join_all(opens).await {
        match r {
            Ok(s) => held.push(s.into_inner()),
            Err(e) => *refused.entry(format!("{:?}", e.code())).or_default() += 1,
        }
    }
    (held, refused)
}

async fn streams(args: &BenchArgs) -> Result<(), CliError> {
    let n = args.abuse_streams;
    let bound = args.abuse_max_open_rpcs;
    let gw = Gateway::start(
        "streams",
        "{}",
        &["--max-open-rpcs".into(), bound.to_string()],
        false,
    )
    .await?;
    let url = gw.url();
    let mut probe = connect(&url, None).await?;
    latencies(&mut probe, "calculator", CALC, 50).await;
    let rss_idle = gw.rss();
    let t = Instant::now();
    let idle = latencies(&mut probe, "calculator", CALC, LATENCY_CALLS).await;
    print_report(&timed("calculator, idle", idle, t.elapsed()), args.json);

    let conns = n.div_ceil(STREAMS_PER_CONNECTION).max(1);
    let mut clients = Vec::with_capacity(conns);
    for _ in 0..conns {
        clients.push(connect(&url, None).await?);
    }
    let t = Instant::now();
    let (held, refused) = open_streams(&clients, n).await;
    let open_ms = t.elapsed().as_millis() as u64;
    let rss_held = gw.rss();
    fact(
        args.json,
        json!({"abuse": "streams", "streams_held": held.len(), "asked": n,
               "connections": conns, "open_all_ms": open_ms, "refused": refused,
               "gateway_rss_idle_kib": rss_idle, "gateway_rss_held_kib": rss_held,
               "kib_per_stream": (rss_held.saturating_sub(rss_idle)) as f64 / held.len().max(1) as f64}),
    );
    let t = Instant::now();
    let during = latencies(&mut probe, "calculator", CALC, LATENCY_CALLS).await;
    print_report(
        &timed(
            &format!("calculator, {} held", held.len()),
            during,
            t.elapsed(),
        ),
        args.json,
    );

    // At the bound: fill it (and 100 past it) with more streams; a call there is refused
    // with a typed error, and health checks still answer.
    // New connections: those of the held streams are at --max-concurrent-streams, and a
    // stream past it would wait in the client for one of them to end.
    let room = bound.saturating_sub(held.len());
    let mut more = Vec::new();
    for _ in 0..(room + 100).div_ceil(STREAMS_PER_CONNECTION) {
        more.push(connect(&url, None).await?);
    }
    let t = Instant::now();
    let (extra, extra_refused) = open_streams(&more, room + 100).await;
    let fill_ms = t.elapsed().as_millis() as u64;
    let at_bound = probe.call_tool(call_req("calculator", CALC)).await;
    let at_bound_code = match &at_bound {
        Ok(_) => "OK".to_string(),
        Err(e) => format!("{:?}", e.code()),
    };
    let retry_after = at_bound
        .as_ref()
        .err()
        .and_then(|e| e.metadata().get("retry-after"))
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let channel = tonic::transport::Channel::from_shared(url.clone())
        .map_err(usage)?
        .connect()
        .await
        .map_err(usage)?;
    let health = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map(|r| {
            tonic_health::pb::health_check_response::ServingStatus::try_from(r.into_inner().status)
                .map_or("?", |s| s.as_str_name())
        })
        .map_err(|e| format!("{:?}", e.code()));
    let rss_full = gw.rss();
    fact(
        args.json,
        json!({"abuse": "streams at the bound", "max_open_rpcs": bound,
               "streams_held": held.len() + extra.len(), "fill_ms": fill_ms,
               "refused": extra_refused, "calculator_at_bound": at_bound_code,
               "retry_after": retry_after, "health_at_bound": match health { Ok(s) => s.to_string(), Err(e) => e },
               "gateway_rss_full_kib": rss_full}),
    );
    drop(extra);
    drop(held);
    drop(clients);
    drop(more);
    // The gateway frees a stream when it sees the reset; give it a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t = Instant::now();
    let after = latencies(&mut probe, "calculator", CALC, LATENCY_CALLS).await;
    print_report(
        &timed("calculator, streams closed", after, t.elapsed()),
        args.json,
    );
    let rss_after = gw.rss();
    // The allocator keeps what it was given; holding the same streams again must reuse it,
    // not grow (a leak would).
    let mut clients = Vec::with_capacity(conns);
    for _ in 0..conns {
        clients.push(connect(&url, None).await?);
    }
    let (again, _) = open_streams(&clients, n).await;
    let rss_again = gw.rss();
    let again_held = again.len();
    drop(again);
    drop(clients);
    fact(
        args.json,
        json!({"abuse": "streams closed", "gateway_rss_after_kib": rss_after,
               "streams_held_again": again_held, "gateway_rss_held_again_kib": rss_again,
               "gateway_rss_peak_kib": gw.hwm()}),
    );
    Ok(())
}

/// A gRPC codec that sends and receives raw bytes: for requests that are not protobuf.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
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

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// An MCP `initialize`: answered at once.
const MCP_INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}"#;

/// `n` sequential MCP `initialize` requests over a pooled HTTP/1.1 client: latencies (µs)
/// and the requests not answered 200.
async fn initialize_latencies(http: &HttpClient, mcp: SocketAddr, n: usize) -> (Vec<u64>, usize) {
    let mut lat = Vec::with_capacity(n);
    let mut failures = 0;
    for _ in 0..n {
        let t = Instant::now();
        let r = post(
            http,
            format!("http://{mcp}/mcp"),
            Bytes::from_static(MCP_INITIALIZE.as_bytes()),
        )
        .await;
        lat.push(t.elapsed().as_micros() as u64);
        failures += usize::from(!matches!(r, Ok((200, _))));
    }
    (lat, failures)
}

/// A slow request on the HTTP listener: a head announcing 1,000 bytes of body, and 17 of
/// them; the gateway holds it while it waits for the rest.
async fn slow_request(mcp: SocketAddr, path: &str) -> std::io::Result<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(mcp).await?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-11-25\r\n\
         Content-Length: 1000\r\n\r\n{{\"jsonrpc\":\"2.0\","
    );
    s.write_all(head.as_bytes()).await?;
    Ok(s)
}

async fn http_held(args: &BenchArgs) -> Result<(), CliError> {
    let bound = args.abuse_max_open_http_requests;
    let gw = Gateway::start(
        "http",
        "{}",
        &["--max-open-http-requests".into(), bound.to_string()],
        false,
    )
    .await?;
    let http: HttpClient =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let mut probe = connect(&gw.url(), None).await?;
    initialize_latencies(&http, gw.mcp, 50).await;
    let rss_idle = gw.rss();
    let t = Instant::now();
    let idle = initialize_latencies(&http, gw.mcp, LATENCY_CALLS).await;
    print_report(&timed("mcp initialize, idle", idle, t.elapsed()), args.json);
    latencies(&mut probe, "calculator", CALC, 50).await;
    let t = Instant::now();
    let grpc = latencies(&mut probe, "calculator", CALC, LATENCY_CALLS).await;
    print_report(
        &timed("calculator (gRPC), idle", grpc, t.elapsed()),
        args.json,
    );
    // The pooled client's idle connection holds no request; it is closed all the same, so
    // the bound is filled by the slow requests alone.
    drop(http);

    let t = Instant::now();
    let mut held = Vec::with_capacity(bound);
    for i in 0..bound {
        let path = if i % 2 == 0 {
            "/mcp"
        } else {
            "/v1/openai/tool-calls"
        };
        held.push(slow_request(gw.mcp, path).await?);
    }
    let open_ms = t.elapsed().as_millis() as u64;
    // The gateway reads each head as its connection is accepted: wait until the bound
    // refuses, i.e. every slow request holds its slot.
    let fresh = || {
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build_http::<http_body_util::Full<Bytes>>()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let uri = format!("http://{}/mcp", gw.mcp);
    let body = Bytes::from_static(MCP_INITIALIZE.as_bytes());
    while !matches!(
        post(&fresh(), uri.clone(), body.clone()).await,
        Ok((429, _))
    ) {
        if Instant::now() > deadline {
            return Err(usage("the HTTP bound never refused"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rss_held = gw.rss();
    // What the next requests get, each on a connection of its own.
    let mut answers = std::collections::BTreeMap::<String, usize>::new();
    let t = Instant::now();
    for _ in 0..100 {
        let key = match post(&fresh(), uri.clone(), body.clone()).await {
            Ok((429, b)) if b.contains("--max-open-http-requests") => "429".to_string(),
            Ok((s, _)) => s.to_string(),
            Err(e) => e,
        };
        *answers.entry(key).or_default() += 1;
    }
    let refusal_us = t.elapsed().as_micros() as u64 / 100;
    let t = Instant::now();
    let grpc = latencies(&mut probe, "calculator", CALC, LATENCY_CALLS).await;
    print_report(
        &timed(
            &format!("calculator (gRPC), {bound} HTTP held"),
            grpc,
            t.elapsed(),
        ),
        args.json,
    );
    fact(
        args.json,
        json!({"abuse": "http", "slow_requests_held": held.len(), "open_all_ms": open_ms,
               "next_100": answers, "refusal_us_each": refusal_us,
               "gateway_rss_idle_kib": rss_idle, "gateway_rss_held_kib": rss_held,
               "kib_per_request": (rss_held.saturating_sub(rss_idle)) as f64 / held.len().max(1) as f64}),
    );
    drop(held);
    let http: HttpClient =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(post(&http, uri.clone(), body.clone()).await, Ok((200, _))) {
        if Instant::now() > deadline {
            return Err(usage("the HTTP slots never came back"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t = Instant::now();
    let after = initialize_latencies(&http, gw.mcp, LATENCY_CALLS).await;
    print_report(
        &timed("mcp initialize, released", after, t.elapsed()),
        args.json,
    );
    fact(
        args.json,
        json!({"abuse": "http", "gateway_rss_released_kib": gw.rss(), "gateway_hwm_kib": gw.hwm()}),
    );
    Ok(())
}

/// One kind of bad request of the flood, and what it must get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bad {
    /// CallTool one byte over `--max-message-bytes`: RESOURCE_EXHAUSTED.
    GrpcOversize,
    /// Bytes that are not HTTP/2 on the gRPC port: the connection closed (after GOAWAY
    /// with an error code when the junk follows a valid preface).
    GrpcGarbage,
    /// A gRPC frame whose payload is not a CallToolRequest: INTERNAL (what gRPC servers
    /// answer an undecodable request: grpc-go "error unmarshalling request", tonic alike).
    GrpcBadProtobuf,
    /// arguments_json that is not JSON: a result, INVALID_ARGUMENTS.
    GrpcBadJson,
    /// A tool that does not exist: a result, UNKNOWN_TOOL.
    GrpcUnknownTool,
    /// POST /mcp one byte over the limit: 413, JSON-RPC -32600.
    McpHuge,
    /// POST /mcp of broken JSON: 400, JSON-RPC -32700.
    McpMalformed,
    /// POST /mcp of a JSON-RPC batch: 400, -32600.
    McpBatch,
    /// POST /v1/openai/tool-calls one byte over the limit: 413 body_too_large.
    HttpHuge,
    /// POST /v1/openai/tool-calls of broken JSON: 400 not_json.
    HttpMalformed,
    /// POST /v1/nope/tool-calls: 404 unknown_provider.
    HttpUnknownProvider,
}

const ALL_BAD: [Bad; 11] = [
    Bad::GrpcOversize,
    Bad::GrpcGarbage,
    Bad::GrpcBadProtobuf,
    Bad::GrpcBadJson,
    Bad::GrpcUnknownTool,
    Bad::McpHuge,
    Bad::McpMalformed,
    Bad::McpBatch,
    Bad::HttpHuge,
    Bad::HttpMalformed,
    Bad::HttpUnknownProvider,
];

type HttpClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Full<Bytes>,
>;

/// Where the flood goes and what it needs.
#[derive(Clone)]
struct Target {
    grpc: SocketAddr,
    mcp: SocketAddr,
    client: Client,
    raw: tonic::client::Grpc<tonic::transport::Channel>,
    http: HttpClient,
    oversize: Arc<String>,
    oversize_body: Bytes,
}

async fn post(http: &HttpClient, uri: String, body: Bytes) -> Result<(u16, String), String> {
    use http_body_util::BodyExt;
    let req = http::Request::post(uri)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .body(http_body_util::Full::new(body))
        .map_err(|e| e.to_string())?;
    let resp = http.request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Sends one bad request of kind `bad`: whether it got its typed refusal (else what it got).
async fn send_bad(t: &mut Target, bad: Bad, i: u64) -> Result<(), String> {
    let result_code = |r: Result<tonic::Response<pb::CallToolResponse>, tonic::Status>| {
        let r = r.map_err(|e| format!("status {:?}", e.code()))?;
        let res = r.into_inner().result.ok_or("no result")?;
        Ok::<_, String>(
            res.error
                .map(|e| crate::grpc::error_code_name(e.code))
                .unwrap_or_else(|| "OK".into()),
        )
    };
    let expect = |got: String, want: &str| {
        if got == want {
            Ok(())
        } else {
            Err(format!("{got} (want {want})"))
        }
    };
    let http_expect = |r: Result<(u16, String), String>, status: u16, needle: &str| {
        let (s, body) = r?;
        if s == status && body.contains(needle) {
            Ok(())
        } else {
            Err(format!(
                "HTTP {s} {:.200} (want {status} with {needle})",
                body
            ))
        }
    };
    match bad {
        Bad::GrpcOversize => {
            let r = t.client.call_tool(call_req("echo", &t.oversize)).await;
            match r {
                Err(e) if e.code() == tonic::Code::ResourceExhausted => Ok(()),
                other => Err(format!(
                    "{:?} (want ResourceExhausted)",
                    other.map(|_| "OK")
                )),
            }
        }
        Bad::GrpcGarbage => garbage_h2(t.grpc, i).await,
        Bad::GrpcBadProtobuf => {
            // Alternately: a varint that never ends, and a string field that is not UTF-8.
            let payload = if i.is_multiple_of(2) {
                vec![0xff; 64]
            } else {
                vec![0x12, 0x04, 0xff, 0xfe, 0xfd, 0xfc]
            };
            t.raw.ready().await.map_err(|e| e.to_string())?;
            let r = t
                .raw
                .unary(
                    tonic::Request::new(payload),
                    http::uri::PathAndQuery::from_static("/toolrun.v1.ToolService/CallTool"),
                    RawCodec,
                )
                .await;
            match r {
                Err(e) if e.code() == tonic::Code::Internal => Ok(()),
                other => Err(format!("{:?} (want Internal)", other.map(|_| "OK"))),
            }
        }
        Bad::GrpcBadJson => expect(
            result_code(
                t.client
                    .call_tool(call_req("calculator", r#"{"expression": "#))
                    .await,
            )?,
            "INVALID_ARGUMENTS",
        ),
        Bad::GrpcUnknownTool => expect(
            result_code(
                t.client
                    .call_tool(call_req(&format!("no_such_tool_{i}"), "{}"))
                    .await,
            )?,
            "UNKNOWN_TOOL",
        ),
        Bad::McpHuge => http_expect(
            post(
                &t.http,
                format!("http://{}/mcp", t.mcp),
                t.oversize_body.clone(),
            )
            .await,
            413,
            "-32600",
        ),
        Bad::McpMalformed => http_expect(
            post(
                &t.http,
                format!("http://{}/mcp", t.mcp),
                Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"#),
            )
            .await,
            400,
            "-32700",
        ),
        Bad::McpBatch => http_expect(
            post(
                &t.http,
                format!("http://{}/mcp", t.mcp),
                Bytes::from_static(br#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#),
            )
            .await,
            400,
            "-32600",
        ),
        Bad::HttpHuge => http_expect(
            post(
                &t.http,
                format!("http://{}/v1/openai/tool-calls", t.mcp),
                t.oversize_body.clone(),
            )
            .await,
            413,
            "body_too_large",
        ),
        Bad::HttpMalformed => http_expect(
            post(
                &t.http,
                format!("http://{}/v1/openai/tool-calls", t.mcp),
                Bytes::from_static(b"{\"role\": \"assistant\", \"tool_calls\": [{"),
            )
            .await,
            400,
            "not_json",
        ),
        Bad::HttpUnknownProvider => http_expect(
            post(
                &t.http,
                format!("http://{}/v1/nope/tool-calls", t.mcp),
                Bytes::from_static(b"{}"),
            )
            .await,
            404,
            "unknown_provider",
        ),
    }
}

/// Writes garbage to the gRPC port. Without the HTTP/2 preface (even `i`) the gateway
/// sends its SETTINGS and closes the connection (h2 sends no GOAWAY before a preface); after
/// a valid preface (odd `i`) the junk frames get GOAWAY with an error code, then the close.
async fn garbage_h2(addr: SocketAddr, i: u64) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let with_preface = !i.is_multiple_of(2);
    let mut junk = if with_preface {
        // The preface, then a DATA frame on stream 0 where SETTINGS must come first: a
        // complete frame, so the gateway never waits for more of it.
        let mut j = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        j.extend([0, 0, 8, 0, 0, 0, 0, 0, 0]);
        j.extend([0xAA; 8]);
        j
    } else {
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()
    };
    // Deterministic pseudo-random bytes (xorshift).
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for _ in 0..512 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        junk.push(x as u8);
    }
    let _ = s.write_all(&junk).await;
    let _ = s.shutdown().await;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    if read.is_err() {
        return Err("connection still open after 5 s".into());
    }
    // HTTP/2 frames: 3 bytes length, type, flags, 4 bytes stream; GOAWAY is type 7 with
    // the last stream id and the error code.
    let mut goaway = None;
    let mut at = 0;
    while at + 9 <= buf.len() {
        let len = (usize::from(buf[at]) << 16)
            | (usize::from(buf[at + 1]) << 8)
            | usize::from(buf[at + 2]);
        if buf[at + 3] == 7 && at + 17 <= buf.len() {
            goaway = Some(u32::from_be_bytes(
                buf[at + 13..at + 17].try_into().expect("4 bytes"),
            ));
        }
        at += 9 + len;
    }
    match (with_preface, goaway) {
        (true, Some(code)) if code != 0 => Ok(()),
        (false, None) => Ok(()),
        (_, g) => Err(format!(
            "closed after {} bytes, GOAWAY {g:?} (preface sent: {with_preface})",
            buf.len()
        )),
    }
}

/// Latencies of one client in alternating windows without and with a load switched on by
/// `active`: both sides see the same background load of a shared machine. Returns the
/// two reports and the seconds the load was on.
struct Interleaved {
    off: (Vec<u64>, usize, Duration),
    on: (Vec<u64>, usize, Duration),
    on_secs: f64,
}

/// Windows per interleaved measurement (each side gets half).
const WINDOWS: usize = 10;

/// How long a switched load takes to start or stop (calls in flight finish).
const SETTLE: Duration = Duration::from_millis(200);

async fn interleave(
    client: &mut Client,
    active: &AtomicBool,
    tool: &str,
    targs: &str,
    calls_per_window: usize,
) -> Interleaved {
    let mut out = Interleaved {
        off: (Vec::new(), 0, Duration::ZERO),
        on: (Vec::new(), 0, Duration::ZERO),
        on_secs: 0.0,
    };
    for w in 0..WINDOWS {
        let on = w % 2 == 1;
        active.store(on, Ordering::Relaxed);
        tokio::time::sleep(SETTLE).await;
        let t = Instant::now();
        let (lat, failures) = latencies(client, tool, targs, calls_per_window).await;
        let side = if on { &mut out.on } else { &mut out.off };
        side.0.extend(lat);
        side.1 += failures;
        side.2 += t.elapsed();
        if on {
            out.on_secs += (SETTLE + t.elapsed()).as_secs_f64();
        }
    }
    active.store(false, Ordering::Relaxed);
    out
}

/// Waits while the load is off; false once it should stop.
async fn wait_active(stop: &AtomicBool, active: &AtomicBool) -> bool {
    while !active.load(Ordering::Relaxed) {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    !stop.load(Ordering::Relaxed)
}

async fn flood(args: &BenchArgs) -> Result<(), CliError> {
    let gw = Gateway::start("flood", "{}", &[], false).await?;
    // The gateway runs with the default --max-message-bytes.
    let max = crate::serve::ServeArgs::default().max_message_bytes;
    let url = gw.url();
    let mut probe = connect(&url, None).await?;
    latencies(&mut probe, "calculator", CALC, 50).await;
    let rss_idle = gw.rss();

    let oversize = format!(r#"{{"message":"{}"}}"#, "x".repeat(max));
    let channel = tonic::transport::Channel::from_shared(url.clone())
        .map_err(usage)?
        .connect()
        .await
        .map_err(usage)?;
    let target = Target {
        grpc: gw.grpc,
        mcp: gw.mcp,
        client: connect(&url, None).await?,
        raw: tonic::client::Grpc::new(channel),
        http: hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http(),
        oversize_body: Bytes::from(oversize.clone().into_bytes()),
        oversize: Arc::new(oversize),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let active = Arc::new(AtomicBool::new(false));
    let counts: Arc<Vec<(AtomicU64, AtomicU64)>> = Arc::new(
        ALL_BAD
            .iter()
            .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
            .collect(),
    );
    let (rss_stop, rss_task) = sample_rss(gw.pid);
    let mut tasks = Vec::new();
    for (k, bad) in ALL_BAD.iter().copied().enumerate() {
        for w in 0..args.abuse_flooders {
            let (mut t, stop, active, counts) =
                (target.clone(), stop.clone(), active.clone(), counts.clone());
            let mut pace = pacer(args.abuse_rate, ALL_BAD.len() * args.abuse_flooders);
            tasks.push(tokio::spawn(async move {
                let mut i = w as u64;
                let mut shown = false;
                while wait_active(&stop, &active).await {
                    if let Some(p) = &mut pace {
                        p.tick().await;
                    }
                    i += 1;
                    match send_bad(&mut t, bad, i).await {
                        Ok(()) => counts[k].0.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            if !shown {
                                eprintln!("{bad:?}: unexpected answer: {e}");
                                shown = true;
                            }
                            counts[k].1.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            }));
        }
    }
    // The well-formed calls on their own connection, in windows with and without the flood.
    let per_window = (args.abuse_seconds * 1000.0 / WINDOWS as f64) as usize;
    let m = interleave(&mut probe, &active, "calculator", CALC, per_window.max(10)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    drop(rss_stop);
    let rss_peak = rss_task.await.unwrap_or(0);
    print_report(
        &report("calculator, no flood", 1, m.off.0, m.off.1, m.off.2),
        args.json,
    );
    print_report(
        &report("calculator, during flood", 1, m.on.0, m.on.1, m.on.2),
        args.json,
    );
    let secs = m.on_secs;
    let mut total = 0;
    let mut wrong = 0;
    for (k, bad) in ALL_BAD.iter().enumerate() {
        let (ok, bad_answers) = (
            counts[k].0.load(Ordering::Relaxed),
            counts[k].1.load(Ordering::Relaxed),
        );
        total += ok;
        wrong += bad_answers;
        fact(
            args.json,
            json!({"abuse": "flood", "kind": format!("{bad:?}"), "typed_refusals": ok,
                   "unexpected": bad_answers, "per_sec": (ok as f64 / secs).round()}),
        );
    }
    fact(
        args.json,
        json!({"abuse": "flood total", "flood_seconds": (secs * 10.0).round() / 10.0,
               "flooders_per_kind": args.abuse_flooders, "paced_per_sec": args.abuse_rate,
               "typed_refusals": total, "unexpected": wrong,
               "refused_per_sec": (total as f64 / secs).round(),
               "gateway_rss_idle_kib": rss_idle, "gateway_rss_peak_kib": rss_peak,
               "gateway_rss_after_kib": gw.rss()}),
    );
    Ok(())
}

async fn tenants(args: &BenchArgs) -> Result<(), CliError> {
    let dir = std::env::temp_dir().join(format!("toolrun-bench-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let keys = dir.join("keys.yaml");
    let _ = std::fs::remove_file(&keys);
    let flood_key = crate::auth::keys::create(&keys, "flood", Some("flood")).map_err(usage)?;
    let quiet_key = crate::auth::keys::create(&keys, "quiet", Some("quiet")).map_err(usage)?;
    let config = "auth:\n  tenants:\n    flood:\n      limits: {calls_per_minute: 600, burst: 20, \
                  runs_in_flight: 1}\n    quiet: {}\n";
    let sandbox = !args.no_sandbox;
    let gw = Gateway::start(
        "tenants",
        config,
        &["--api-keys".into(), keys.display().to_string()],
        sandbox,
    )
    .await;
    // The keys file stays while the gateway runs (it is read again every 2 s).
    let gw = match gw {
        Ok(gw) => gw,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    let url = gw.url();
    let mut quiet = connect(&url, Some(&quiet_key)).await?;
    latencies(&mut quiet, "calculator", CALC, 50).await;
    if sandbox {
        latencies(&mut quiet, "run_code", PRINT1, 3).await;
    }
    let rss_idle = gw.rss();

    // Tenant flood: half its callers on calculator, half on run_code (no backing off on
    // retry-after: an abusive client), switched on and off by `active`.
    let stop = Arc::new(AtomicBool::new(false));
    let active = Arc::new(AtomicBool::new(false));
    // ok, RESOURCE_EXHAUSTED with retry-after, anything else.
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let mut tasks = Vec::new();
    let flooders = args.abuse_flooders.max(1) * 4;
    for w in 0..flooders {
        let mut c = connect(&url, Some(&flood_key)).await?;
        let (stop, active, counts) = (stop.clone(), active.clone(), counts.clone());
        let (tool, targs) = if sandbox && w % 2 == 1 {
            ("run_code", PRINT1)
        } else {
            ("calculator", CALC)
        };
        let mut pace = pacer(args.abuse_rate, flooders);
        tasks.push(tokio::spawn(async move {
            let mut shown = false;
            while wait_active(&stop, &active).await {
                if let Some(p) = &mut pace {
                    p.tick().await;
                }
                let i = match c.call_tool(call_req(tool, targs)).await {
                    Ok(r) if r.get_ref().result.as_ref().is_some_and(|r| r.ok) => 0,
                    Err(e)
                        if e.code() == tonic::Code::ResourceExhausted
                            && e.metadata().get("retry-after").is_some() =>
                    {
                        1
                    }
                    other => {
                        if !shown {
                            eprintln!("flood {tool}: unexpected {other:?}");
                            shown = true;
                        }
                        2
                    }
                };
                counts[i].fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let (rss_stop, rss_task) = sample_rss(gw.pid);
    let calc = interleave(
        &mut quiet,
        &active,
        "calculator",
        CALC,
        LATENCY_CALLS * 2 / WINDOWS,
    )
    .await;
    let runs = if sandbox {
        Some(
            interleave(
                &mut quiet,
                &active,
                "run_code",
                PRINT1,
                (args.sandbox_runs * 2).div_ceil(WINDOWS),
            )
            .await,
        )
    } else {
        None
    };
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    drop(rss_stop);
    let rss_peak = rss_task.await.unwrap_or(0);
    // What the gateway keeps once the flood is over (its calls answered, connections idle).
    tokio::time::sleep(SETTLE).await;
    let rss_after = gw.rss();
    let secs = calc.on_secs + runs.as_ref().map_or(0.0, |r| r.on_secs);
    let pair = |name: &str, m: Interleaved| {
        [
            report(
                &format!("quiet {name}, alone"),
                1,
                m.off.0,
                m.off.1,
                m.off.2,
            ),
            report(&format!("quiet {name}, flooded"), 1, m.on.0, m.on.1, m.on.2),
        ]
    };
    let calc = pair("calculator", calc);
    let runs = runs.map(|r| pair("run_code", r));
    for r in calc.iter().chain(runs.iter().flatten()) {
        print_report(r, args.json);
    }
    let [ok, exhausted, other] = [0, 1, 2].map(|i| counts[i].load(Ordering::Relaxed));
    let ratio = |[idle, loaded]: &[Report; 2]| {
        (loaded.p99_us as f64 / idle.p99_us.max(1) as f64 * 100.0).round() / 100.0
    };
    fact(
        args.json,
        json!({"abuse": "tenants", "flood_callers": flooders, "paced_per_sec": args.abuse_rate,
               "flood_seconds": (secs * 10.0).round() / 10.0,
               "flood_ok": ok, "flood_resource_exhausted": exhausted, "flood_other": other,
               "flood_sent_per_sec": ((ok + exhausted + other) as f64 / secs).round(),
               "flood_refused_per_sec": (exhausted as f64 / secs).round(),
               "quiet_calculator_p99_ratio": ratio(&calc),
               "quiet_run_code_p99_ratio": runs.as_ref().map(ratio),
               "gateway_rss_idle_kib": rss_idle, "gateway_rss_peak_kib": rss_peak,
               "gateway_rss_after_kib": rss_after}),
    );
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Tenant `a`, without limits of its own, opens streams until refused; tenant `b`'s calls
/// and streams meanwhile. `percent`: `auth.tenant_share_percent` (default: the gateway's).
async fn shares(args: &BenchArgs, percent: Option<u8>) -> Result<(), CliError> {
    let bound = args.abuse_max_open_rpcs;
    let dir = std::env::temp_dir().join(format!("toolrun-bench-shares-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let keys = dir.join("keys.yaml");
    let _ = std::fs::remove_file(&keys);
    let a_key = crate::auth::keys::create(&keys, "a", Some("a")).map_err(usage)?;
    let b_key = crate::auth::keys::create(&keys, "b", Some("b")).map_err(usage)?;
    let share = percent.map_or(String::new(), |p| format!("  tenant_share_percent: {p}\n"));
    let config = format!("auth:\n{share}  tenants:\n    a: {{}}\n    b: {{}}\n");
    let label = percent.map_or("default share".to_string(), |p| format!("share {p}%"));
    let gw = Gateway::start(
        "shares",
        &config,
        &[
            "--api-keys".into(),
            keys.display().to_string(),
            "--max-open-rpcs".into(),
            bound.to_string(),
        ],
        false,
    )
    .await;
    let gw = match gw {
        Ok(gw) => gw,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    let url = gw.url();
    let mut b = connect(&url, Some(&b_key)).await?;
    latencies(&mut b, "calculator", CALC, 50).await;
    let t = Instant::now();
    let alone = latencies(&mut b, "calculator", CALC, LATENCY_CALLS).await;
    print_report(
        &timed(
            &format!("b calculator, alone ({label})"),
            alone,
            t.elapsed(),
        ),
        args.json,
    );
    let rss_idle = gw.rss();
    // `a` asks for the whole bound, and 100 more, over enough connections.
    let conns = (bound + 100).div_ceil(STREAMS_PER_CONNECTION);
    let mut clients = Vec::with_capacity(conns);
    for _ in 0..conns {
        clients.push(connect(&url, Some(&a_key)).await?);
    }
    let t = Instant::now();
    let (held, refused) = open_streams(&clients, bound + 100).await;
    let open_ms = t.elapsed().as_millis();
    let mut refusal = String::new();
    if let Err(e) = clients[0]
        .watch_approvals(pb::WatchApprovalsRequest {
            session_id: String::new(),
        })
        .await
    {
        refusal = e.message().to_string();
    }
    let rss_held = gw.rss();
    let t = Instant::now();
    let during = latencies(&mut b, "calculator", CALC, LATENCY_CALLS).await;
    let b_failures = during.1;
    print_report(
        &timed(
            &format!("b calculator, a holding ({label})"),
            during,
            t.elapsed(),
        ),
        args.json,
    );
    // `b`'s own streams, on connections of its own, up to what is left.
    let b_conns = (bound / 2 + 100).div_ceil(STREAMS_PER_CONNECTION);
    let mut b_clients = Vec::with_capacity(b_conns);
    for _ in 0..b_conns {
        b_clients.push(connect(&url, Some(&b_key)).await?);
    }
    let (b_held, b_refused) = open_streams(&b_clients, bound / 2 + 100).await;
    let rss_peak = gw.rss();
    fact(
        args.json,
        json!({"abuse": "shares", "tenant_share_percent": percent.unwrap_or(
                   crate::auth::config::DEFAULT_TENANT_SHARE_PERCENT),
               "max_open_rpcs": bound, "a_asked": bound + 100, "a_held": held.len(),
               "a_refused": refused, "a_refusal": refusal, "a_open_ms": open_ms,
               "b_calculator_failures": b_failures,
               "b_asked": bound / 2 + 100, "b_held": b_held.len(), "b_refused": b_refused,
               "gateway_rss_idle_kib": rss_idle, "gateway_rss_a_held_kib": rss_held,
               "gateway_rss_both_held_kib": rss_peak}),
    );
    drop((held, b_held, clients, b_clients));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t = Instant::now();
    let after = latencies(&mut b, "calculator", CALC, LATENCY_CALLS).await;
    print_report(
        &timed(
            &format!("b calculator, released ({label})"),
            after,
            t.elapsed(),
        ),
        args.json,
    );
    fact(
        args.json,
        json!({"abuse": "shares released", "gateway_rss_after_kib": gw.rss()}),
    );
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
