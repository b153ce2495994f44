//! Raw HTTP/1.1 for the tests that speak to the gateway's listeners below any client
//! library (`mcp.rs`, `abuse.rs`, `tenant_isolation.rs` through `abuse_common`): one
//! exchange on its own connection (`Connection: close`), read to the end.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long an answer may take.
const ANSWER_BOUND: Duration = Duration::from_secs(30);

/// What an exchange tolerates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// The whole request is sent and the connection ends cleanly after the answer; an
    /// error or no answer within 30 s fails the test.
    Answer,
    /// The gateway may answer (`413`) and close before it has read the whole body, so
    /// the send may fail and the read end with a reset: whatever came back is parsed.
    MayCloseEarly,
}

/// An answer: status, head as sent (status line and headers) and body.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Reply {
    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The head of a POST to `path` as MCP clients send it (JSON, SSE accepted, the protocol
/// version), with `extra` header lines (each ending in `\r\n`) and a body of `len` bytes.
pub fn post_head(path: &str, extra: &str, len: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-11-25\r\n\
         {extra}Content-Length: {len}\r\nConnection: close\r\n\r\n"
    )
}

/// `Authorization: Bearer <key>\r\n`, or nothing.
pub fn bearer(key: Option<&str>) -> String {
    key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"))
}

/// Sends `head` then `body` on a new connection to `addr` and reads the answer to the end.
/// Panics when nothing parses as an HTTP answer.
pub async fn exchange(addr: SocketAddr, head: &str, body: &[u8], expect: Expect) -> Reply {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let sent = s.write_all(body).await;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(ANSWER_BOUND, s.read_to_end(&mut buf)).await;
    if expect == Expect::Answer {
        sent.unwrap();
        read.expect("an answer within 30 s").unwrap();
    }
    let split = buf.windows(4).position(|w| w == b"\r\n\r\n");
    let (head, body) = match split {
        Some(i) => (&buf[..i], &buf[i + 4..]),
        None => (&buf[..], &[][..]),
    };
    let head = String::from_utf8_lossy(head).into_owned();
    let status = head
        .strip_prefix("HTTP/1.1 ")
        .and_then(|s| s.get(..3)?.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "not an HTTP answer from {addr}: {:.300}",
                String::from_utf8_lossy(&buf)
            )
        });
    Reply {
        status,
        head,
        body: body.to_vec(),
    }
}
