//! A `toolrun serve` child process for the load-and-abuse tests (`abuse.rs`,
//! `tenant_isolation.rs`): loopback, ephemeral ports, no sandbox, its own state dir.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use toolrun::cli::{Client, connect};
use toolrun_proto::v1 as pb;

pub const BIN: &str = env!("CARGO_BIN_EXE_toolrun");

/// A `toolrun serve` child, stopped with SIGTERM on drop.
pub struct Gw {
    child: std::process::Child,
    pub grpc: SocketAddr,
    pub mcp: SocketAddr,
    pub log: std::path::PathBuf,
    pub dir: tempfile::TempDir,
}

impl Gw {
    /// Starts `toolrun serve --no-sandbox` with `config` (YAML) and `args`.
    pub fn start(dir: tempfile::TempDir, config: &str, args: &[&str]) -> Gw {
        let cfg = dir.path().join("toolrun.yaml");
        std::fs::write(&cfg, config).unwrap();
        let log = dir.path().join("gateway.log");
        let mut child = Command::new(BIN)
            .args(["--log-format", "json", "serve", "--no-sandbox"])
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .args(["--mcp-listen", "127.0.0.1:0"])
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--config")
            .arg(&cfg)
            .args(args)
            .env_remove("TOOLRUN_API_KEYS")
            .env_remove("TOOLRUN_MAX_OPEN_RPCS")
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
                let addr = |k: &str| -> SocketAddr {
                    v[k].as_str()
                        .unwrap()
                        .trim_start_matches("Some(")
                        .trim_end_matches(')')
                        .parse()
                        .unwrap()
                };
                return Gw {
                    grpc: addr("grpc"),
                    mcp: addr("mcp"),
                    child,
                    log,
                    dir,
                };
            }
            if let Some(status) = child.try_wait().unwrap() {
                panic!("gateway exited {status}:\n{text}");
            }
            assert!(Instant::now() < deadline, "gateway did not start:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    pub async fn client(&self, key: Option<&str>) -> Client {
        connect(&self.url(), key).await.unwrap()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
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
pub fn create_key(keys: &Path, tenant: &str, name: &str) -> String {
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
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

pub fn calc() -> pb::CallToolRequest {
    call_req("calculator", r#"{"expression":"2 + 3 * sqrt(16)"}"#)
}

pub fn call_req(tool: &str, args: &str) -> pb::CallToolRequest {
    pb::CallToolRequest {
        call_id: String::new(),
        tool: tool.into(),
        arguments_json: args.into(),
        timeout_ms: 0,
        session_id: String::new(),
    }
}

/// `n` sequential calculator calls: latencies (µs, sorted) and the calls not answered ok.
pub async fn calc_latencies(c: &mut Client, n: usize) -> (Vec<u64>, Vec<String>) {
    let mut lat = Vec::with_capacity(n);
    let mut failed = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let r = c.call_tool(calc()).await;
        lat.push(t.elapsed().as_micros() as u64);
        match r {
            Ok(r) if r.get_ref().result.as_ref().is_some_and(|r| r.ok) => {}
            other => failed.push(format!("{other:?}")),
        }
    }
    lat.sort_unstable();
    (lat, failed)
}

/// The `p` quantile of sorted latencies.
pub fn pct(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}
