//! `toolrun bench`: a gRPC load generator.
//!
//! Measures `echo` and `calculator` at several concurrencies and `run_code` python
//! `print(1)` beside bare `python3 -c 'print(1)'`, all in one run, so the ratios are
//! comparable on a noisy machine; `--sandbox-concurrency 1,8,32` runs the `run_code`
//! scenario with that many callers each, and `--rss-pid` samples a (remote) gateway's
//! memory meanwhile. Without `--addr` it starts an in-process gateway on
//! loopback ephemeral ports and benchmarks it over real gRPC.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use tonic::transport::Channel;
use toolrun_proto::v1 as pb;
use toolrun_proto::v1::tool_service_client::ToolServiceClient;

use crate::cli::{CliError, connect};
use crate::serve::{ServeArgs, start};

/// Settings of `toolrun bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Gateway to load (default: start one in-process on loopback).
    #[arg(long, env = "TOOLRUN_ADDR")]
    pub addr: Option<String>,
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
    tool: &str,
    args: &str,
    concurrency: usize,
    seconds: f64,
) -> Result<Report, CliError> {
    // A few HTTP/2 connections, shared round-robin by the callers.
    let conns = concurrency.clamp(1, 8);
    let mut clients = Vec::with_capacity(conns);
    for _ in 0..conns {
        clients.push(connect(addr).await?);
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
    let mut all = Vec::new();
    let mut failures = 0;
    for t in tasks {
        let (lat, f) = t
            .await
            .map_err(|e| CliError::Usage(format!("bench task: {e}")))?;
        all.extend(lat);
        failures += f;
    }
    Ok(report(tool, concurrency, all, failures, start.elapsed()))
}

async fn sandbox_scenario(addr: &str, runs: usize, concurrency: usize) -> Result<Report, CliError> {
    let concurrency = concurrency.max(1);
    let client = connect(addr).await?;
    let args = json!({"language": "python", "code": "print(1)"}).to_string();
    let call = {
        let args = args.clone();
        move |mut client: ToolServiceClient<Channel>| {
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
    let mut lat = Vec::with_capacity(runs);
    let mut failures = 0;
    for t in tasks {
        let (l, f) = t
            .await
            .map_err(|e| CliError::Usage(format!("bench task: {e}")))?;
        lat.extend(l);
        failures += f;
    }
    Ok(report(
        "run_code python print(1)",
        concurrency,
        lat,
        failures,
        start.elapsed(),
    ))
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
    let mut server = None;
    let addr = match &args.addr {
        Some(a) => a.clone(),
        None => {
            let running = start(ServeArgs {
                listen: "127.0.0.1:0".parse().expect("valid"),
                admin_listen: "127.0.0.1:0".parse().expect("valid"),
                no_sandbox: args.no_sandbox,
                ..ServeArgs::default()
            })
            .await
            .map_err(|e| CliError::Usage(format!("cannot start the in-process gateway: {e}")))?;
            let addr = format!("http://{}", running.grpc_addr);
            server = Some(running);
            addr
        }
    };
    if !args.json {
        println!(
            "{:<28} {:>4} {:>9} {:>6} {:>12} {:>10} {:>10}",
            "SCENARIO", "CONC", "CALLS", "FAILS", "CALLS/S", "P50_US", "P99_US"
        );
    }
    for &c in args.concurrency.iter().filter(|_| !args.no_inline) {
        let r = inline_scenario(&addr, "echo", r#"{"message":"hello"}"#, c, args.seconds).await?;
        print_report(&r, args.json);
        let r = inline_scenario(
            &addr,
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
            let r = sandbox_scenario(&addr, args.sandbox_runs, c).await?;
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
    if let Some(s) = server {
        s.shutdown();
        let _ = s.wait().await;
    }
    Ok(())
}

impl From<crate::serve::ServeError> for CliError {
    fn from(e: crate::serve::ServeError) -> Self {
        CliError::Usage(e.to_string())
    }
}
