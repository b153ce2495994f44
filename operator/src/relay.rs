//! The operator's side of the in-pod agent (`toolrun-runner agent`, PID 1 of a session or
//! warm pod): JSON-lines requests over a `pods/attach` stream, through the Kubernetes API
//! only. The pod keeps its deny-all NetworkPolicy and has no service-account token; only the
//! operator holds `pods/attach`, in the sandbox namespace.
//!
//! A dropped stream is reattached and the request in flight is sent again: the agent
//! executes an id at most once and answers a repeat with what it has (the buffered events
//! then the live ones, or the stored final event), and [`Tracker`] drops duplicates and
//! orders what arrives (asking `resume {target, after_seq}` to fill a gap), so nothing is
//! lost or seen twice. When the pod is gone or the agent cannot be reattached
//! within the retry budget, the call ends with a typed [`RelayError`], never a hang.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::AttachParams;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use toolrun_runner::agent::client::{Tracker, decode, encode};
use toolrun_runner::agent::proto::{Body, Op, Request, Response};

/// Longest response line read from the agent (a run's record with its output and artifacts
/// fits well within it).
pub const MAX_LINE_BYTES: u64 = 64 << 20;

/// Why a request could not be completed.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// Attaching failed (the pod is gone, not running, or the API server refused).
    #[error("attaching to pod {pod}: {source}")]
    Attach {
        /// The pod.
        pod: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// The stream broke and could not be reattached within the retry budget.
    #[error("the agent in pod {pod} is unreachable after {attempts} attempts: {last}")]
    Unreachable {
        /// The pod.
        pod: String,
        /// Reattach attempts made.
        attempts: u32,
        /// The last failure.
        last: String,
    },
    /// The agent wrote something that is not a response line.
    #[error("the agent in pod {pod} wrote a bad line: {why}")]
    Protocol {
        /// The pod.
        pod: String,
        /// What was wrong.
        why: String,
    },
}

/// One attach stream.
struct Stream {
    /// Kept so the websocket stays open while we use its halves.
    _process: kube::api::AttachedProcess,
    stdin: Box<dyn AsyncWrite + Unpin + Send + Sync>,
    stdout: BufReader<Box<dyn AsyncRead + Unpin + Send + Sync>>,
}

/// A connection to the agent of one pod, reattached as needed.
pub struct Agent {
    pods: Api<Pod>,
    pod: String,
    container: String,
    stream: Option<Stream>,
    tracker: Tracker,
    next_id: u64,
    /// Reattach attempts per broken stream, with a doubling pause from 100 ms.
    pub max_attempts: u32,
}

impl Agent {
    /// Attaches to `container` of `pod` (it must run the agent with `stdin: true` and
    /// `stdinOnce: false`).
    pub async fn attach(pods: Api<Pod>, pod: &str, container: &str) -> Result<Agent, RelayError> {
        let mut agent = Agent {
            pods,
            pod: pod.to_string(),
            container: container.to_string(),
            stream: None,
            tracker: Tracker::new(),
            next_id: 0,
            max_attempts: 6,
        };
        agent.stream = Some(agent.open().await?);
        Ok(agent)
    }

    async fn open(&self) -> Result<Stream, RelayError> {
        let params = AttachParams::default()
            .container(self.container.clone())
            .stdin(true)
            .stdout(true)
            .stderr(false);
        let mut process = self
            .pods
            .attach(&self.pod, &params)
            .await
            .map_err(|source| RelayError::Attach {
                pod: self.pod.clone(),
                source,
            })?;
        let protocol = |why: &str| RelayError::Protocol {
            pod: self.pod.clone(),
            why: why.into(),
        };
        let stdin = process.stdin().ok_or_else(|| protocol("no stdin"))?;
        let stdout = process.stdout().ok_or_else(|| protocol("no stdout"))?;
        Ok(Stream {
            _process: process,
            stdin: Box::new(stdin),
            stdout: BufReader::new(Box::new(stdout)),
        })
    }

    /// A request id unique within this connection's agent (`prefix` names its purpose).
    pub fn new_id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}-{}-{}", std::process::id(), self.next_id)
    }

    /// Drops the stream as a network failure would (tests of reconnection).
    pub fn drop_stream(&mut self) {
        self.stream = None;
    }

    /// Sends `request` and returns its final event; `on_event` sees each event before it
    /// (stdout/stderr chunks, `lost`), in order and exactly once, across reattachments.
    pub async fn call(
        &mut self,
        request: Request,
        mut on_event: impl FnMut(&Response),
    ) -> Result<Response, RelayError> {
        let id = request.id.clone();
        let mut pending = Some(encode(&request));
        let mut failures = 0u32;
        let mut last_failure = String::new();
        loop {
            if self.stream.is_none() {
                if failures >= self.max_attempts {
                    return Err(RelayError::Unreachable {
                        pod: self.pod.clone(),
                        attempts: failures,
                        last: last_failure,
                    });
                }
                tokio::time::sleep(Duration::from_millis(100 << failures.min(6))).await;
                match self.open().await {
                    Ok(s) => self.stream = Some(s),
                    Err(e) => {
                        failures += 1;
                        last_failure = e.to_string();
                        continue;
                    }
                }
                // The request may or may not have reached the agent: send it again. An id is
                // executed at most once: a repeat in flight replays its buffered events from
                // seq 1, then the live ones; a finished one its stored final event. The
                // tracker drops what we already have.
                pending = Some(encode(&request));
            }
            let stream = self.stream.as_mut().expect("opened above");
            if let Some(lines) = pending.take()
                && let Err(e) = write_all(&mut stream.stdin, lines.as_bytes()).await
            {
                failures += 1;
                last_failure = format!("writing: {e}");
                self.stream = None;
                continue;
            }
            let mut line = Vec::new();
            let read = (&mut stream.stdout)
                .take(MAX_LINE_BYTES + 1)
                .read_until(b'\n', &mut line)
                .await;
            match read {
                Ok(0) => {
                    failures += 1;
                    last_failure = "the stream ended".into();
                    self.stream = None;
                    continue;
                }
                Err(e) => {
                    failures += 1;
                    last_failure = format!("reading: {e}");
                    self.stream = None;
                    continue;
                }
                Ok(_) if line.len() as u64 > MAX_LINE_BYTES => {
                    return Err(RelayError::Protocol {
                        pod: self.pod.clone(),
                        why: format!("a line longer than {MAX_LINE_BYTES} bytes"),
                    });
                }
                Ok(_) => {}
            }
            let text = String::from_utf8_lossy(&line);
            let response = decode(&text).map_err(|e| RelayError::Protocol {
                pod: self.pod.clone(),
                why: format!("{e}: {}", text.chars().take(120).collect::<String>()),
            })?;
            for r in self.tracker.push(response) {
                if r.id.as_deref() != Some(id.as_str()) {
                    // Answers to our resumes and to requests of earlier calls.
                    continue;
                }
                if r.body.is_final() {
                    self.tracker.forget(&id);
                    return Ok(r);
                }
                on_event(&r);
            }
            if self.tracker.waiting(&id) {
                let resume = Request {
                    id: self.new_id("resume"),
                    op: Op::Resume {
                        target: id.clone(),
                        after_seq: self.tracker.last_seq(&id),
                    },
                };
                pending = Some(encode(&resume));
            }
        }
    }

    /// Tells the agent it may forget these finished requests.
    pub async fn ack(&mut self, targets: Vec<String>) -> Result<(), RelayError> {
        let id = self.new_id("ack");
        let r = self
            .call(
                Request {
                    id,
                    op: Op::Ack { targets },
                },
                |_| {},
            )
            .await?;
        match r.body {
            Body::Ok { .. } => Ok(()),
            other => Err(RelayError::Protocol {
                pod: self.pod.clone(),
                why: format!("ack answered {other:?}"),
            }),
        }
    }
}

async fn write_all(w: &mut (impl AsyncWrite + Unpin), bytes: &[u8]) -> std::io::Result<()> {
    w.write_all(bytes).await?;
    w.flush().await
}
