//! `toolrun bench`: a gRPC (and MCP) load generator.
//!
//! Measures `echo` and `calculator` at several concurrencies, `echo` through MCP's
//! `tools/call` (Streamable HTTP, protocol 2025-11-25, one keep-alive connection per client
//! as MCP clients hold) at the same concurrencies beside gRPC, and `run_code` python
//! `print(1)` beside bare `python3 -c 'print(1)'`, all in one run, so the ratios are
//! comparable on a noisy machine; `--sandbox-concurrency 1,8,32` runs the `run_code`
//! scenario with that many callers each, and `--rss-pid` samples a (remote) gateway's
//! memory meanwhile. The session scenarios measure `CreateSession`, `read_file` and
//! `write_file` of 100 KiB, `grep` over a workspace of `--grep-files` files beside `rg` on
//! the same tree, and `shell` `echo hi` beside bare `bash -c`. Without `--addr` it starts an
//! in-process gateway on loopback ephemeral ports and benchmarks it over real gRPC.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use toolrun_proto::v1 as pb;

use crate::cli::{CliError, Client, ClientTls, connect_with};
use crate::serve::{ServeArgs, start};

mod abuse;

/// Settings of `toolrun bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Gateway to load (default: start one in-process on loopback).
    #[arg(long, env = "TOOLRUN_ADDR")]
    pub addr: Option<String>,
    /// API key of the gateway at `--addr` (gRPC and MCP).
    #[arg(long, env = "TOOLRUN_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// TLS to the gateway at `--addr` (gRPC scenarios; an `https://` address).
    #[command(flatten)]
    pub tls: ClientTls,
    /// Seconds per inline scenario.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Concurrent callers for the inline scenarios (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 64])]
    pub concurrency: Vec<usize>,
    /// Sequential run_code samples (and as many bare python3 runs).
    #[arg(long, default_value_t = 40)]
    pub sandbox_runs: usize,
    /// Skip the run_code scenario.
    #[arg(long)]
    pub no_sandbox: bool,
    /// Skip the inline scenarios (echo, calculator).
    #[arg(long)]
    pub no_inline: bool,
    /// Concurrent callers of the run_code scenario, one scenario per value
    /// (`--sandbox-runs` runs each).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize])]
    pub sandbox_concurrency: Vec<usize>,
    /// Process whose resident memory is sampled during each run_code scenario (e.g. a
    /// remote gateway's pid on this node): prints its RSS before and at the peak.
    #[arg(long)]
    pub rss_pid: Option<u32>,
    /// Python interpreter for the bare baseline.
    #[arg(long, default_value = "/usr/bin/python3")]
    pub python: String,
    /// Print results as JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Skip the session scenarios (CreateSession, file tools, grep, shell).
    #[arg(long)]
    pub no_sessions: bool,
    /// Samples of each session scenario.
    #[arg(long, default_value_t = 50)]
    pub session_runs: usize,
    /// Sessions of the sustained scenario, one scenario per value: as many sessions, each
    /// with one caller sending `--session-runs` run_code `print(1)` back to back (0: skip).
    #[arg(long, value_delimiter = ',', default_values_t = vec![8usize])]
    pub session_concurrency: Vec<usize>,
    /// Files in the grep scenario's workspace (copies of the source files under
    /// `--grep-source`).
    #[arg(long, default_value_t = 10_000)]
    pub grep_files: usize,
    /// Where the grep scenario's files come from (`*.rs`, `*.md`, `*.proto`, `*.yaml` under it).
    #[arg(long, default_value = ".")]
    pub grep_source: std::path::PathBuf,
    /// ripgrep for the grep baseline.
    #[arg(long, default_value = "rg")]
    pub rg: String,
    /// MCP endpoint for the MCP scenario (default: the in-process gateway's; with `--addr`
    /// and no `--mcp-url` the scenario is skipped).
    #[arg(long, env = "TOOLRUN_MCP_URL")]
    pub mcp_url: Option<String>,
    /// Skip the MCP scenario.
    #[arg(long)]
    pub no_mcp: bool,
    /// Skip the code-interpreter scenarios (pandas, a matplotlib chart as an artifact).
    #[arg(long)]
    pub no_interp: bool,
    /// Samples of each code-interpreter scenario (and of its bare baseline).
    #[arg(long, default_value_t = 20)]
    pub interp_runs: usize,
    /// Skip the custom-tool scenario (a custom bash tool beside run_code of the same
    /// script; with `--addr` the gateway must declare [`BENCH_CUSTOM_TOOL`]).
    #[arg(long)]
    pub no_custom: bool,
    /// Run the load-and-abuse scenarios instead of the others, each against its own
    /// `toolrun serve` child (see `--abuse-scenarios`).
    #[arg(long)]
    pub abuse: bool,
    /// Which abuse scenarios: `streams` (streams held open, up to the bound), `http` (slow
    /// HTTP requests held open, up to the listener's bound), `flood` (malformed and
    /// oversized requests on every front door), `tenants` (one tenant over its limits
    /// beside another), `shares` (a tenant without limits holding its default share of
    /// `--abuse-max-open-rpcs` beside another, and the control at a share of 100%).
    #[arg(long, value_delimiter = ',', default_values_t = ["streams".to_string(), "http".into(), "flood".into(), "tenants".into(), "shares".into()])]
    pub abuse_scenarios: Vec<String>,
    /// Streams the `streams` scenario holds open.
    #[arg(long, default_value_t = 10_000)]
    pub abuse_streams: usize,
    /// `--max-open-rpcs` of the `streams` scenario's gateway (the bound it then fills).
    #[arg(long, default_value_t = crate::inflight::DEFAULT_MAX_OPEN_RPCS)]
    pub abuse_max_open_rpcs: usize,
    /// `--max-open-http-requests` of the `http` scenario's gateway: the slow requests it
    /// holds (the bound it fills).
    #[arg(long, default_value_t = crate::inflight::DEFAULT_MAX_OPEN_HTTP_REQUESTS)]
    pub abuse_max_open_http_requests: usize,
    /// Seconds the flood lasts (the well-formed calls are timed meanwhile).
    #[arg(long, default_value_t = 10.0)]
    pub abuse_seconds: f64,
    /// Concurrent flooders per kind of bad request (`flood`); four times as many callers
    /// for the tenant over its limits (`tenants`).
    #[arg(long, default_value_t = 2)]
    pub abuse_flooders: usize,
    /// Requests per second of the flood (`flood`: all kinds together; `tenants`: the
    /// tenant over its limits), spread over its callers; 0: a closed loop, each caller
    /// sending again as soon as it is answered (as fast as this machine allows).
    #[arg(long, default_value_t = 1000.0)]
    pub abuse_rate: f64,
}

/// The code-interpreter scenarios' pandas program: `import numpy, pandas` and a
/// 100,000-row groupby aggregation.
const PANDAS_PROGRAM: &str = "import numpy as np, pandas as pd\n\
    df = pd.DataFrame({'k': np.arange(100_000) % 7, 'v': np.arange(100_000)})\n\
    print(int(df.groupby('k')['v'].sum().sum()))\n";

/// What [`PANDAS_PROGRAM`] prints.
const PANDAS_OUT: &str = "4999950000\n";

/// A line chart saved to the outputs directory (`OUT` is replaced).
const CHART_PROGRAM: &str = "import matplotlib\nmatplotlib.use('Agg')\n\
    import matplotlib.pyplot as plt\n\
    plt.figure(figsize=(6, 4), dpi=100)\nplt.plot(range(100), [x * x for x in range(100)])\n\
    plt.title('squares')\nplt.savefig('OUT/chart.png')\n";

/// The code-interpreter scenarios: the pandas program through run_code and bare (python3
/// directly, the same program, same runs), and a chart returned as a PNG artifact through
/// run_code and saved bare.
async fn interp_scenarios(addr: &str, args: &BenchArgs) -> Result<Vec<Report>, CliError> {
    let client = connect_with(addr, args.api_key.as_deref(), &args.tls).await?;
    let runs = args.interp_runs;
    let mut out = Vec::new();
    let through = |code: String, check: fn(&str) -> bool| {
        let client = client.clone();
        move || {
            let mut client = client.clone();
            let args = json!({"language": "python", "code": code.clone(), "timeout": 30});
            async move {
                let (us, ok, output) = call_ok(&mut client, "run_code", &args, "").await;
                let ok = ok && check(&output);
                if !ok {
                    eprintln!("run_code: unexpected output {output:.300}");
                }
                (us, ok)
            }
        }
    };
    let bare = |code: String, expect: &'static str| {
        let python = args.python.clone();
        move || {
            let (python, code) = (python.clone(), code.clone());
            async move {
                let t = Instant::now();
                let out = std::process::Command::new(&python)
                    .args(["-c", &code])
                    .env_clear()
                    .env("PATH", "/usr/bin:/bin")
                    .env("HOME", "/tmp")
                    .output();
                let us = t.elapsed().as_micros() as u64;
                (
                    us,
                    out.is_ok_and(|o| o.status.success() && o.stdout == expect.as_bytes()),
                )
            }
        }
    };
    fn pandas_ok(o: &str) -> bool {
        o.contains(&format!("\"stdout\":{}", json!(PANDAS_OUT)))
    }
    fn chart_ok(o: &str) -> bool {
        o.contains("\"name\":\"chart.png\"") && o.contains("\"media_type\":\"image/png\"")
    }
    out.extend(
        sample_pair(
            ["run_code pandas 100k groupby", "bare python3 pandas 100k"],
            runs,
            through(PANDAS_PROGRAM.into(), pandas_ok),
            bare(PANDAS_PROGRAM.into(), PANDAS_OUT),
        )
        .await,
    );
    let dir = std::env::temp_dir().join(format!("toolrun-bench-chart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| CliError::Usage(e.to_string()))?;
    out.extend(
        sample_pair(
            [
                "run_code matplotlib artifact",
                "bare python3 matplotlib png",
            ],
            runs,
            through(CHART_PROGRAM.replace("OUT", "/tmp/outputs"), chart_ok),
            bare(CHART_PROGRAM.replace("OUT", &dir.display().to_string()), ""),
        )
        .await,
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(out)
}

/// Times `a` and `b` `runs` times each, alternating (after one warm-up of each), so that a
/// shared machine's load falls on both alike.
async fn sample_pair<A, FA, B, FB>(names: [&str; 2], runs: usize, mut a: A, mut b: B) -> [Report; 2]
where
    A: FnMut() -> FA,
    FA: std::future::Future<Output = (u64, bool)>,
    B: FnMut() -> FB,
    FB: std::future::Future<Output = (u64, bool)>,
{
    a().await;
    b().await;
    let (mut lat, mut failures) = ([Vec::new(), Vec::new()], [0usize; 2]);
    let start = Instant::now();
    for _ in 0..runs {
        let (us, ok) = a().await;
        lat[0].push(us);
        failures[0] += usize::from(!ok);
        let (us, ok) = b().await;
        lat[1].push(us);
        failures[1] += usize::from(!ok);
    }
    let elapsed = start.elapsed() / 2;
    let [la, lb] = lat;
    [
        report(names[0], 1, la, failures[0], elapsed),
        report(names[1], 1, lb, failures[1], elapsed),
    ]
}

/// One scenario's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// Concurrent callers.
    pub concurrency: usize,
    /// Completed calls.
    pub calls: usize,
    /// Calls that did not return ok.
    pub failures: usize,
    /// Calls per second.
    pub calls_per_sec: f64,
    /// Median latency, microseconds.
    pub p50_us: u64,
    /// 99th percentile latency, microseconds.
    pub p99_us: u64,
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Waits for the callers' tasks: their latencies (microseconds) together, their failures
/// summed.
async fn gather(
    tasks: Vec<tokio::task::JoinHandle<(Vec<u64>, usize)>>,
) -> Result<(Vec<u64>, usize), CliError> {
    let mut all = Vec::new();
    let mut failures = 0;
    for t in tasks {
        let (lat, f) = t
            .await
            .map_err(|e| CliError::Usage(format!("bench task: {e}")))?;
        all.extend(lat);
        failures += f;
    }
    Ok((all, failures))
}

fn report(
    scenario: &str,
    concurrency: usize,
    mut lat: Vec<u64>,
    failures: usize,
    wall: Duration,
) -> Report {
    lat.sort_unstable();
    Report {
        scenario: scenario.to_string(),
        concurrency,
        calls: lat.len(),
        failures,
        calls_per_sec: lat.len() as f64 / wall.as_secs_f64(),
        p50_us: percentile(&lat, 0.50),
        p99_us: percentile(&lat, 0.99),
    }
}

async fn inline_scenario(
    addr: &str,
    key: Option<&str>,
    tls: &ClientTls,
    tool: &str,
    args: &str,
    concurrency: usize,
    seconds: f64,
) -> Result<Report, CliError> {
    // A few HTTP/2 connections, shared round-robin by the callers.
    let conns = concurrency.clamp(1, 8);
    let mut clients = Vec::with_capacity(conns);
    for _ in 0..conns {
        clients.push(connect_with(addr, key, tls).await?);
    }
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    // Hard bound on calls per caller so the loop always ends.
    let max_calls_per_caller = 5_000_000 / concurrency.max(1);
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(concurrency);
    for i in 0..concurrency {
        let mut client = clients[i % conns].clone();
        let tool = tool.to_string();
        let args = args.to_string();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(4096);
            let mut failures = 0usize;
            while Instant::now() < deadline && lat.len() < max_calls_per_caller {
                let t = Instant::now();
                let r = client
                    .call_tool(pb::CallToolRequest {
                        call_id: String::new(),
                        tool: tool.clone(),
                        arguments_json: args.clone(),
                        timeout_ms: 0,
                        session_id: String::new(),
                    })
                    .await;
                lat.push(t.elapsed().as_micros() as u64);
                match r {
                    Ok(resp) if resp.get_ref().result.as_ref().is_some_and(|r| r.ok) => {}
                    _ => failures += 1,
                }
            }
            (lat, failures)
        }));
    }
    let (all, failures) = gather(tasks).await?;
    Ok(report(tool, concurrency, all, failures, start.elapsed()))
}

/// `tools/call` of `echo` over MCP: each of `concurrency` clients opens its own HTTP/1.1
/// connection, initializes once and then posts its calls on it, as an MCP client does (no
/// pool shared between callers: a shared pool races new connections against ones being
/// returned, and its lock is the callers' in common).
async fn mcp_scenario(
    url: &str,
    key: Option<&str>,
    concurrency: usize,
    seconds: f64,
) -> Result<Report, CliError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| CliError::Usage(format!("--mcp-url {url:?}: {e}")))?;
    let (Some(authority), Some("http") | None) = (uri.authority().cloned(), uri.scheme_str())
    else {
        return Err(CliError::Usage(format!(
            "--mcp-url {url:?}: an http:// URL with a host"
        )));
    };
    let bearer = key.map(|k| format!("Bearer {k}"));
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "toolrun-bench", "version": env!("CARGO_PKG_VERSION")}}})
    .to_string();
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let max_calls_per_caller = 5_000_000 / concurrency.max(1);
    let mut tasks = Vec::with_capacity(concurrency);
    let start = Instant::now();
    for _ in 0..concurrency {
        let (uri, authority, bearer, init) =
            (uri.clone(), authority.clone(), bearer.clone(), init.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = match McpConnection::open(uri, authority, bearer).await {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("MCP connection failed: {e}");
                    return (Vec::new(), 1);
                }
            };
            if let Err(e) = client.post(init).await {
                eprintln!("MCP initialize failed: {e}");
                return (Vec::new(), 1);
            }
            let mut lat = Vec::with_capacity(4096);
            let mut failures = 0usize;
            let mut id = 0u64;
            while Instant::now() < deadline && lat.len() < max_calls_per_caller {
                id += 1;
                let body = format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"message":"hello"}}}}}}"#
                );
                let t = Instant::now();
                let r = client.post(body).await;
                lat.push(t.elapsed().as_micros() as u64);
                let ok = r.as_ref().is_ok_and(|b| {
                    let b = String::from_utf8_lossy(b);
                    b.contains(r#""isError":false"#) && b.contains("hello")
                });
                if !ok && failures == 0 {
                    eprintln!("MCP tools/call failed: {r:?}");
                }
                failures += usize::from(!ok);
            }
            (lat, failures)
        }));
    }
    let (all, failures) = gather(tasks).await?;
    Ok(report(
        "mcp tools/call echo",
        concurrency,
        all,
        failures,
        start.elapsed(),
    ))
}

/// One MCP client's HTTP/1.1 connection (keep-alive), its `Mcp-Session-Id` once
/// `initialize` answered one.
struct McpConnection {
    sender: hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>,
    uri: http::Uri,
    authority: http::uri::Authority,
    bearer: Option<String>,
    session: Option<String>,
}

impl McpConnection {
    async fn open(
        uri: http::Uri,
        authority: http::uri::Authority,
        bearer: Option<String>,
    ) -> Result<Self, String> {
        let port = authority.port_u16().unwrap_or(80);
        let tcp = tokio::net::TcpStream::connect((authority.host(), port))
            .await
            .map_err(|e| format!("{authority}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(McpConnection {
            sender,
            uri,
            authority,
            bearer,
            session: None,
        })
    }

    /// POSTs `body`; the answer's body, or why there is none.
    async fn post(&mut self, body: String) -> Result<bytes::Bytes, String> {
        use http_body_util::BodyExt;
        let path = self.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut req = http::Request::post(path)
            .header(http::header::HOST, self.authority.as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25");
        if let Some(s) = &self.session {
            req = req.header("mcp-session-id", s);
        }
        if let Some(b) = &self.bearer {
            req = req.header(http::header::AUTHORIZATION, b);
        }
        let req = req
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        self.sender.ready().await.map_err(|e| e.to_string())?;
        let resp = self
            .sender
            .send_request(req)
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        if let Some(s) = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        {
            self.session = Some(s.to_string());
        }
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if !status.is_success() {
            return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&body)));
        }
        Ok(body)
    }
}

async fn sandbox_scenario(
    addr: &str,
    key: Option<&str>,
    tls: &ClientTls,
    runs: usize,
    concurrency: usize,
) -> Result<Report, CliError> {
    let concurrency = concurrency.max(1);
    let client = connect_with(addr, key, tls).await?;
    let args = json!({"language": "python", "code": "print(1)"}).to_string();
    let call = {
        let args = args.clone();
        move |mut client: Client| {
            let args = args.clone();
            async move {
                let t = Instant::now();
                let r = client
                    .call_tool(pb::CallToolRequest {
                        call_id: String::new(),
                        tool: "run_code".into(),
                        arguments_json: args,
                        timeout_ms: 0,
                        session_id: String::new(),
                    })
                    .await;
                let us = t.elapsed().as_micros() as u64;
                let result = r.ok().and_then(|r| r.into_inner().result);
                let ok = result
                    .as_ref()
                    .is_some_and(|r| r.ok && r.output_json.contains("\"stdout\":\"1\\n\""));
                if !ok {
                    eprintln!("run_code failed: {result:?}");
                }
                (us, ok)
            }
        }
    };
    // Two warm-up runs (page cache, cgroup directories, images) are not counted.
    for _ in 0..2 {
        call(client.clone()).await;
    }
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let (client, next, call) = (client.clone(), next.clone(), call.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut failures = 0usize;
            while next.fetch_add(1, Ordering::Relaxed) < runs {
                let (us, ok) = call(client.clone()).await;
                lat.push(us);
                failures += usize::from(!ok);
            }
            (lat, failures)
        }));
    }
    let (lat, failures) = gather(tasks).await?;
    Ok(report(
        "run_code python print(1)",
        concurrency,
        lat,
        failures,
        start.elapsed(),
    ))
}

async fn call_ok(
    client: &mut Client,
    tool: &str,
    args: &serde_json::Value,
    session: &str,
) -> (u64, bool, String) {
    let t = Instant::now();
    let r = client
        .call_tool(pb::CallToolRequest {
            call_id: String::new(),
            tool: tool.into(),
            arguments_json: args.to_string(),
            timeout_ms: 0,
            session_id: session.into(),
        })
        .await;
    let us = t.elapsed().as_micros() as u64;
    match r.ok().and_then(|r| r.into_inner().result) {
        Some(r) if r.ok => (us, true, r.output_json),
        other => {
            eprintln!("{tool} failed: {other:?}");
            (us, false, String::new())
        }
    }
}

/// Times `f` `runs` times (after one warm-up).
async fn sample<F, Fut>(name: &str, runs: usize, mut f: F) -> Report
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = (u64, bool)>,
{
    f().await;
    let mut lat = Vec::with_capacity(runs);
    let mut failures = 0;
    let start = Instant::now();
    for _ in 0..runs {
        let (us, ok) = f().await;
        lat.push(us);
        failures += usize::from(!ok);
    }
    report(name, 1, lat, failures, start.elapsed())
}

/// The grep scenario's files: the sources under `dir`, as (relative path, content).
fn grep_corpus(dir: &std::path::Path, want: usize) -> Vec<(String, String)> {
    let mut sources = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || name == "target" || name == "node_modules" {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else if ["rs", "md", "proto", "yaml"]
                .iter()
                .any(|x| p.extension().is_some_and(|e| e == *x))
                && let Ok(text) = std::fs::read_to_string(&p)
            {
                sources.push((name, text));
            }
        }
    }
    if sources.is_empty() {
        sources.push(("a.rs".into(), "fn main() {}\n".repeat(200)));
    }
    (0..want)
        .map(|i| {
            let (name, text) = &sources[i % sources.len()];
            (format!("d{:03}/{i}-{name}", i / 100), text.clone())
        })
        .collect()
}

/// `n` sessions, each with one caller sending `runs` run_code `print(1)` back to back: the
/// sustained rate of executions in sessions (the sessions are made first, not timed).
async fn sessions_sustained(client: &Client, n: usize, runs: usize) -> Result<Report, CliError> {
    let mut made = Vec::new();
    for _ in 0..n {
        let mut c = client.clone();
        made.push(tokio::spawn(async move {
            c.create_session(pb::CreateSessionRequest {
                session_id: String::new(),
                approval_mode: pb::ApprovalMode::All as i32,
                idle_timeout_seconds: 0,
            })
            .await
            .map(|r| r.into_inner().session_id)
        }));
    }
    let mut sessions = Vec::new();
    for m in made {
        sessions.push(
            m.await
                .map_err(|e| CliError::Usage(format!("bench task: {e}")))??,
        );
    }
    let code = json!({"language": "python", "code": "print(1)"});
    let start = Instant::now();
    let mut tasks = Vec::new();
    for s in &sessions {
        let (mut c, code, s) = (client.clone(), code.clone(), s.clone());
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut failed) = (Vec::with_capacity(runs), 0);
            for _ in 0..runs {
                let (us, ok, o) = call_ok(&mut c, "run_code", &code, &s).await;
                lat.push(us);
                failed += usize::from(!(ok && o.contains("\"stdout\":\"1\\n\"")));
            }
            (lat, failed)
        }));
    }
    let (mut lat, mut failures) = (Vec::new(), 0);
    for t in tasks {
        let (l, f) = t
            .await
            .map_err(|e| CliError::Usage(format!("bench task: {e}")))?;
        lat.extend(l);
        failures += f;
    }
    let wall = start.elapsed();
    for s in sessions {
        let _ = client
            .clone()
            .close_session(pb::CloseSessionRequest { session_id: s })
            .await;
    }
    Ok(report(
        &format!("run_code in {n} sessions"),
        n,
        lat,
        failures,
        wall,
    ))
}

async fn session_scenarios(addr: &str, args: &BenchArgs) -> Result<Vec<Report>, CliError> {
    let mut client = connect_with(addr, args.api_key.as_deref(), &args.tls).await?;
    let mut out = Vec::new();
    let runs = args.session_runs.max(1);

    // CreateSession (and its CloseSession, not timed).
    let mut lat = Vec::new();
    let mut failures = 0;
    let start = Instant::now();
    for _ in 0..runs {
        let t = Instant::now();
        let r = client
            .create_session(pb::CreateSessionRequest {
                session_id: String::new(),
                approval_mode: pb::ApprovalMode::All as i32,
                idle_timeout_seconds: 0,
            })
            .await;
        lat.push(t.elapsed().as_micros() as u64);
        match r {
            Ok(s) => {
                let _ = client
                    .close_session(pb::CloseSessionRequest {
                        session_id: s.into_inner().session_id,
                    })
                    .await;
            }
            Err(e) => {
                eprintln!("CreateSession failed: {e}");
                failures += 1;
            }
        }
    }
    out.push(report("CreateSession", 1, lat, failures, start.elapsed()));

    let session = client
        .create_session(pb::CreateSessionRequest {
            session_id: String::new(),
            approval_mode: pb::ApprovalMode::All as i32,
            idle_timeout_seconds: 0,
        })
        .await?
        .into_inner()
        .session_id;
    let content: String = "0123456789abcdef".repeat(100 * 1024 / 16);
    let write = json!({"path": "bench/100k.txt", "content": content, "createDirs": true});
    let c = client.clone();
    out.push(
        sample("write_file 100 KiB", runs, || {
            let (mut c, w, s) = (c.clone(), write.clone(), session.clone());
            async move {
                let (us, ok, _) = call_ok(&mut c, "write_file", &w, &s).await;
                (us, ok)
            }
        })
        .await,
    );
    let read = json!({"path": "bench/100k.txt", "limit": 100000});
    out.push(
        sample("read_file 100 KiB", runs, || {
            let (mut c, r, s) = (c.clone(), read.clone(), session.clone());
            async move {
                let (us, ok, _) = call_ok(&mut c, "read_file", &r, &s).await;
                (us, ok)
            }
        })
        .await,
    );

    if !args.no_sandbox {
        let echo = json!({"command": "echo hi"});
        out.push(
            sample("shell echo hi", runs, || {
                let (mut c, e, s) = (c.clone(), echo.clone(), session.clone());
                async move {
                    let (us, ok, o) = call_ok(&mut c, "shell", &e, &s).await;
                    (us, ok && o.contains("hi\\n"))
                }
            })
            .await,
        );
        out.push(
            sample("bare bash -c 'echo hi'", runs, || async {
                let t = Instant::now();
                let o = std::process::Command::new("bash")
                    .args(["-c", "echo hi"])
                    .env_clear()
                    .output();
                let ok = o.is_ok_and(|o| o.stdout == b"hi\n");
                (t.elapsed().as_micros() as u64, ok)
            })
            .await,
        );
    }

    if !args.no_sandbox {
        for &n in args.session_concurrency.iter().filter(|&&n| n > 0) {
            out.push(sessions_sustained(&client, n, runs).await?);
        }
    }

    // grep over a tree of copies of this repository's sources, beside rg on the same tree.
    let files = grep_corpus(&args.grep_source, args.grep_files);
    let local = std::env::temp_dir().join(format!("toolrun-bench-grep-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&local);
    for (path, text) in &files {
        let p = local.join(path);
        std::fs::create_dir_all(p.parent().expect("has a parent"))?;
        std::fs::write(&p, text)?;
    }
    let next = Arc::new(AtomicUsize::new(0));
    let files = Arc::new(files);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (mut c, next, files, s) =
            (client.clone(), next.clone(), files.clone(), session.clone());
        tasks.push(tokio::spawn(async move {
            let mut failed = 0;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((path, text)) = files.get(i) else {
                    break;
                };
                let a =
                    json!({"path": format!("tree/{path}"), "content": text, "createDirs": true});
                failed += usize::from(!call_ok(&mut c, "write_file", &a, &s).await.1);
            }
            failed
        }));
    }
    for t in tasks {
        let failed = t
            .await
            .map_err(|e| CliError::Usage(format!("bench task: {e}")))?;
        if failed > 0 {
            eprintln!("{failed} files of the grep tree could not be written");
        }
    }
    // Few matches (well under maxResults), so both scan every file and neither is bound
    // by printing; the grep call must report every file searched and nothing truncated.
    let pattern = r"fn\s+(sweep_ephemeral|valid_session)_\w+\(";
    let grep = json!({"pattern": pattern, "path": "tree", "maxResults": 1000});
    let grep_runs = runs.min(20);
    let want = files.len() as u64;
    out.push(
        sample(&format!("grep {} files", files.len()), grep_runs, || {
            let (mut c, g, s) = (c.clone(), grep.clone(), session.clone());
            async move {
                let (us, ok, o) = call_ok(&mut c, "grep", &g, &s).await;
                let v: serde_json::Value = serde_json::from_str(&o).unwrap_or_default();
                let complete = v["filesSearched"] == want && v["truncated"] == false;
                if ok && !complete {
                    eprintln!(
                        "grep did not search the whole tree: {} of {want} files, truncated {}",
                        v["filesSearched"], v["truncated"]
                    );
                }
                (us, ok && complete)
            }
        })
        .await,
    );
    let rg = args.rg.clone();
    let mut rg_ok = true;
    out.push(
        sample(
            &format!("rg {} files (baseline)", files.len()),
            grep_runs,
            || {
                let t = Instant::now();
                let o = std::process::Command::new(&rg)
                    .args(["-n", "--no-heading", "--no-ignore", "--hidden", pattern])
                    .arg(&local)
                    .output();
                // 0: matches, 1: none; both searched the whole tree.
                let ok = o
                    .as_ref()
                    .is_ok_and(|o| matches!(o.status.code(), Some(0) | Some(1)));
                rg_ok &= o.is_ok();
                async move { (t.elapsed().as_micros() as u64, ok) }
            },
        )
        .await,
    );
    if !rg_ok {
        eprintln!(
            "rg not found ({}): install ripgrep for the grep baseline",
            args.rg
        );
    }
    let _ = std::fs::remove_dir_all(&local);
    let _ = client
        .close_session(pb::CloseSessionRequest {
            session_id: session,
        })
        .await;
    Ok(out)
}

/// Resident memory of `pid` in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Samples the RSS of `pid` every 50 ms until the returned sender is dropped; the task
/// returns the peak.
fn sample_rss(
    pid: u32,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<u64>,
) {
    let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut peak = 0;
        loop {
            peak = peak.max(rss_kib(pid).unwrap_or(0));
            tokio::select! {
                _ = &mut rx => return peak,
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    });
    (tx, task)
}

fn bare_python(python: &str, runs: usize) -> Report {
    let mut lat = Vec::with_capacity(runs);
    let mut failures = 0;
    let start = Instant::now();
    for i in 0..runs + 2 {
        let t = Instant::now();
        let out = std::process::Command::new(python)
            .args(["-c", "print(1)"])
            .env_clear()
            .output();
        if i < 2 {
            continue;
        }
        lat.push(t.elapsed().as_micros() as u64);
        if !out.is_ok_and(|o| o.status.success() && o.stdout == b"1\n") {
            failures += 1;
        }
    }
    report(
        "bare python3 -c print(1)",
        1,
        lat,
        failures,
        start.elapsed(),
    )
}

fn print_report(r: &Report, json: bool) {
    if json {
        println!("{}", serde_json::to_string(r).expect("json"));
    } else {
        println!(
            "{:<28} {:>4} {:>9} {:>6} {:>12.2} {:>10} {:>10}",
            r.scenario, r.concurrency, r.calls, r.failures, r.calls_per_sec, r.p50_us, r.p99_us
        );
    }
}

/// Runs every scenario and prints the figures.
pub async fn run(args: BenchArgs) -> Result<(), CliError> {
    if args.abuse {
        return abuse::run(&args).await;
    }
    let mut server = None;
    let mut mcp_url = args.mcp_url.clone();
    // The in-process gateway declares the custom-tool scenario's tool.
    let custom_config =
        std::env::temp_dir().join(format!("toolrun-bench-custom-{}.yaml", std::process::id()));
    let addr = match &args.addr {
        Some(a) => a.clone(),
        None => {
            std::fs::write(&custom_config, bench_custom_config())
                .map_err(|e| CliError::Usage(format!("{}: {e}", custom_config.display())))?;
            let running = start(ServeArgs {
                config: Some(custom_config.clone()),
                listen: "127.0.0.1:0".parse().expect("valid"),
                admin_listen: "127.0.0.1:0".parse().expect("valid"),
                mcp_listen: crate::serve::Listen::On("127.0.0.1:0".parse().expect("valid")),
                no_sandbox: args.no_sandbox,
                ..ServeArgs::default()
            })
            .await
            .map_err(|e| CliError::Usage(format!("cannot start the in-process gateway: {e}")))?;
            let addr = format!("http://{}", running.grpc_addr);
            if mcp_url.is_none() {
                mcp_url = running.mcp_addr.map(|a| format!("http://{a}/mcp"));
            }
            server = Some(running);
            addr
        }
    };
    let key = args.api_key.as_deref();
    if !args.json {
        println!(
            "{:<28} {:>4} {:>9} {:>6} {:>12} {:>10} {:>10}",
            "SCENARIO", "CONC", "CALLS", "FAILS", "CALLS/S", "P50_US", "P99_US"
        );
    }
    for &c in args.concurrency.iter().filter(|_| !args.no_inline) {
        let r = inline_scenario(
            &addr,
            key,
            &args.tls,
            "echo",
            r#"{"message":"hello"}"#,
            c,
            args.seconds,
        )
        .await?;
        print_report(&r, args.json);
        // The same call through MCP, right after gRPC's on the same machine state.
        if let Some(url) = mcp_url.as_deref().filter(|_| !args.no_mcp) {
            let m = mcp_scenario(url, key, c, args.seconds).await?;
            print_report(&m, args.json);
            if !args.json {
                println!(
                    "  mcp / grpc echo at {c}: p50 {:.2}x, calls/s {:.2}x",
                    m.p50_us as f64 / r.p50_us.max(1) as f64,
                    m.calls_per_sec / r.calls_per_sec.max(1e-9)
                );
            }
        }
        let r = inline_scenario(
            &addr,
            key,
            &args.tls,
            "calculator",
            r#"{"expression":"2 + 3 * sqrt(16)"}"#,
            c,
            args.seconds,
        )
        .await?;
        print_report(&r, args.json);
    }
    if !args.no_sandbox {
        let mut sandbox_p50 = 0;
        for &c in &args.sandbox_concurrency {
            let before = args.rss_pid.and_then(rss_kib);
            let sampler = args.rss_pid.map(sample_rss);
            let r = sandbox_scenario(&addr, key, &args.tls, args.sandbox_runs, c).await?;
            if c == 1 || sandbox_p50 == 0 {
                sandbox_p50 = r.p50_us;
            }
            print_report(&r, args.json);
            if let (Some(pid), Some((stop, task))) = (args.rss_pid, sampler) {
                drop(stop);
                let peak = task.await.unwrap_or(0);
                let line = json!({"rss_pid": pid, "concurrency": c,
                    "rss_before_kib": before, "rss_peak_kib": peak});
                if args.json {
                    println!("{line}");
                } else {
                    println!(
                        "  rss of pid {pid}: {} KiB before, {peak} KiB peak",
                        before.map_or("?".to_string(), |b| b.to_string())
                    );
                }
            }
        }
        let b = bare_python(&args.python, args.sandbox_runs);
        print_report(&b, args.json);
        if !args.json {
            println!(
                "sandbox overhead over bare python at p50: {:.1} ms",
                (sandbox_p50 as f64 - b.p50_us as f64) / 1000.0
            );
        }
    }
    if !args.no_sandbox && !args.no_interp {
        let reports = interp_scenarios(&addr, &args).await?;
        for r in &reports {
            print_report(r, args.json);
        }
        if !args.json {
            let p50 = |name: &str| {
                reports
                    .iter()
                    .find(|r| r.scenario.starts_with(name))
                    .map_or(0.0, |r| r.p50_us as f64)
            };
            println!(
                "run_code pandas overhead over bare python3 at p50: {:.1} ms; matplotlib artifact: {:.1} ms",
                (p50("run_code pandas") - p50("bare python3 pandas")) / 1000.0,
                (p50("run_code matplotlib") - p50("bare python3 matplotlib")) / 1000.0
            );
        }
    }
    if !args.no_sandbox && !args.no_custom {
        let reports =
            custom_scenario(&addr, args.sandbox_runs, args.api_key.as_deref(), &args.tls).await?;
        for r in &reports {
            print_report(r, args.json);
        }
        if !args.json {
            println!(
                "custom bash tool overhead over run_code of the same script at p50: {:.2} ms",
                (reports[0].p50_us as f64 - reports[1].p50_us as f64) / 1000.0
            );
        }
    }
    let _ = std::fs::remove_file(&custom_config);
    if !args.no_sessions {
        let reports = session_scenarios(&addr, &args).await?;
        for r in &reports {
            print_report(r, args.json);
        }
        if !args.json {
            let p50 = |name: &str| {
                reports
                    .iter()
                    .find(|r| r.scenario.starts_with(name))
                    .map(|r| r.p50_us as f64)
            };
            if let (Some(s), Some(b)) = (p50("shell echo hi"), p50("bare bash")) {
                println!(
                    "shell overhead over bare bash at p50: {:.1} ms",
                    (s - b) / 1000.0
                );
            }
            if let (Some(g), Some(r)) = (p50("grep "), p50("rg ")) {
                println!("grep / rg at p50: {:.2}x", g / r.max(1.0));
            }
        }
    }
    if let Some(s) = server {
        s.shutdown();
        let _ = s.wait().await;
    }
    Ok(())
}

/// The custom-tool scenario's tool, declared by the in-process gateway.
pub const BENCH_CUSTOM_TOOL: &str = "bench_echo_bash";

/// The script of [`BENCH_CUSTOM_TOOL`], also run through run_code with the same stdin.
const BENCH_CUSTOM_SCRIPT: &str = "read -r args\nprintf '{\"echo\": %s}\\n' \"$args\"\n";

/// The configuration declaring [`BENCH_CUSTOM_TOOL`].
fn bench_custom_config() -> String {
    let tool = json!({
        "name": BENCH_CUSTOM_TOOL,
        "description": "Echoes its arguments (toolrun bench).",
        "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}},
                         "required": ["n"], "additionalProperties": false},
        "output_schema": {"type": "object", "properties": {"echo": {"type": "object"}},
                          "required": ["echo"]},
        "annotations": {"read_only": true, "idempotent": true},
        "implementation": {"language": "bash", "script": BENCH_CUSTOM_SCRIPT},
    });
    // JSON is YAML.
    json!({ "custom_tools": [tool] }).to_string()
}

/// The custom bash tool and run_code of the same script with the same stdin: the custom
/// tool's own cost (argument validation, stdout parsed as JSON and checked against its output
/// schema) is the difference of their p50s. They alternate, each going first every other
/// round, and every call starts after a pause: the local sandbox prepares the next run's
/// sandbox in the background, so a call made right after another would pay for that
/// preparation and whichever tool always went second would look slower.
async fn custom_scenario(
    addr: &str,
    runs: usize,
    api_key: Option<&str>,
    tls: &ClientTls,
) -> Result<[Report; 2], CliError> {
    const SETTLE: Duration = Duration::from_millis(100);
    let mut client = connect_with(addr, api_key, tls).await?;
    let stdin = json!({"n": 1}).to_string();
    let run_code_args = json!({"language": "bash", "code": BENCH_CUSTOM_SCRIPT, "stdin": stdin});
    let custom_args = json!({"n": 1});
    let mut one = async |custom: bool| {
        tokio::time::sleep(SETTLE).await;
        if custom {
            let (us, ok, out) = call_ok(&mut client, BENCH_CUSTOM_TOOL, &custom_args, "").await;
            (us, ok && out == r#"{"echo":{"n":1}}"#)
        } else {
            let (us, ok, out) = call_ok(&mut client, "run_code", &run_code_args, "").await;
            (
                us,
                ok && out.contains(r#""stdout":"{\"echo\": {\"n\":1}}\n""#),
            )
        }
    };
    one(true).await;
    one(false).await;
    let (mut lat, mut failures) = ([Vec::new(), Vec::new()], [0usize; 2]);
    let start = Instant::now();
    for round in 0..runs {
        let order = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for custom in order {
            let (us, ok) = one(custom).await;
            let i = usize::from(!custom);
            lat[i].push(us);
            failures[i] += usize::from(!ok);
        }
    }
    let elapsed = start.elapsed().saturating_sub(SETTLE * (2 * runs) as u32) / 2;
    let [custom, run_code] = lat;
    Ok([
        report("custom bash tool", 1, custom, failures[0], elapsed),
        report(
            "run_code same bash script",
            1,
            run_code,
            failures[1],
            elapsed,
        ),
    ])
}

impl From<crate::serve::ServeError> for CliError {
    fn from(e: crate::serve::ServeError) -> Self {
        CliError::Usage(e.to_string())
    }
}
