//! A `toolrun serve` child process for the load-and-abuse tests (`abuse.rs`,
//! `tenant_isolation.rs`): loopback, ephemeral ports, no sandbox, its own state dir. Each
//! test file using it also declares `mod raw_http;` (the raw HTTP/1.1 client).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use toolrun::cli::{Client, connect};
use toolrun_proto::v1 as pb;

use crate::raw_http;

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
            .env_remove("TOOLRUN_MAX_OPEN_HTTP_REQUESTS")
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

/// An MCP `initialize` request: answered at once (the probe of the HTTP bounds).
pub const MCP_INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

fn http_head(path: &str, key: Option<&str>, len: usize) -> String {
    raw_http::post_head(path, &raw_http::bearer(key), len)
}

/// A POST on the HTTP listener that stays open: its head announces a body of 1000 bytes
/// and only the first few are sent (a slow client), so the gateway holds the request
/// while it waits for the rest. Dropping the stream ends it.
pub async fn hold_http(addr: SocketAddr, path: &str, key: Option<&str>) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(http_head(path, key, 1000).as_bytes())
        .await
        .unwrap();
    s.write_all(br#"{"jsonrpc":"2.0","#).await.unwrap();
    s
}

/// Nothing has been answered on a held request's connection.
pub async fn still_held(s: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut b = [0u8; 1];
    tokio::time::timeout(Duration::from_millis(5), s.read(&mut b))
        .await
        .is_err()
}

/// One POST on the HTTP listener: status, head (lowercase) and body.
pub async fn http_post(
    addr: SocketAddr,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> (u16, String, String) {
    let head = http_head(path, key, body.len());
    let r = raw_http::exchange(
        addr,
        &head,
        body.as_bytes(),
        raw_http::Expect::MayCloseEarly,
    )
    .await;
    (r.status, r.head.to_ascii_lowercase(), r.text())
}

/// Probes `path` with an MCP initialize until it is refused with `429` (the held requests
/// before it all admitted by then); returns the refusal's head and body.
pub async fn until_429(addr: SocketAddr, path: &str, key: Option<&str>) -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, head, body) = http_post(addr, path, key, MCP_INITIALIZE).await;
        if status == 429 {
            return (head, body);
        }
        assert!(
            Instant::now() < deadline,
            "never refused: {status} {body:.300}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Probes `path` with an MCP initialize until it is answered other than `429` (a slot came
/// back); returns that status and body.
pub async fn until_served(addr: SocketAddr, path: &str, key: Option<&str>) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _, body) = http_post(addr, path, key, MCP_INITIALIZE).await;
        if status != 429 {
            return (status, body);
        }
        assert!(Instant::now() < deadline, "the slot never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
