//! Live output for StreamTool: follows the run container's log (the runner's JSON lines)
//! and forwards stdout and stderr chunks. The final record still comes from the ToolRun
//! status; this is only the live view.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::LogParams;
use tokio::io::BufReader;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, watch};
use tokio_util::compat::FuturesAsyncReadCompatExt;
use tokio_util::sync::CancellationToken;
use toolrun_runner::Event;

use super::watch::Seen;
use crate::sandbox::lines::{Line, read_line};
use crate::tool::StreamChunk;

/// Container of the sandbox pod that runs the program (the operator's `RUN_CONTAINER`).
pub const RUN_CONTAINER: &str = "run";

/// What the follower forwarded, per stream (at most the cap each).
#[derive(Debug, Default, Clone)]
pub struct Forwarded {
    /// stdout so far.
    pub stdout: String,
    /// stderr so far.
    pub stderr: String,
}

/// Container of a warm pod: the agent, whose log holds its responses (JSON lines of the
/// runner's events with the request's `id` and `seq`; the operator's `AGENT_CONTAINER`).
pub const AGENT_CONTAINER: &str = "agent";

/// Where the run's output is now.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    /// The pod.
    pod: String,
    /// A warm pod (status condition `Bound=True`): its agent's log carries the run's events
    /// under this request id (the ToolRun's uid), perhaps more than once (a resumed
    /// request is answered again): only seqs above the last one forwarded count.
    agent_request: Option<String>,
}

/// The pod running ToolRun `run` now: the status's `podName` (the operator names a
/// retried pod differently, and a warm pod has a name of its own), else the ToolRun's own
/// name (its first pod's).
fn current_pod(seen: &watch::Receiver<Seen>, run: &str) -> Target {
    let cold = Target {
        pod: run.to_string(),
        agent_request: None,
    };
    let Seen::Object(tr) = &*seen.borrow() else {
        return cold;
    };
    let Some(status) = tr.status.as_ref() else {
        return cold;
    };
    let bound = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Bound" && c.status == "True");
    Target {
        pod: status.pod_name.clone().unwrap_or_else(|| run.to_string()),
        agent_request: bound.then(|| tr.metadata.uid.clone()).flatten(),
    }
}

/// The request fields of an agent response line.
#[derive(serde::Deserialize)]
struct AgentLine {
    id: Option<String>,
    #[serde(default)]
    seq: u64,
}

/// Follows the run container of ToolRun `run`'s pod until the runner's result line, the
/// end of the log, or `stop`. Retries while the pod does not exist yet or its container
/// has not started (the init container copies the runner first), and moves to a new pod
/// when the operator retries the run.
pub async fn follow(
    pods: Api<Pod>,
    run: String,
    seen: watch::Receiver<Seen>,
    cap: usize,
    tx: mpsc::Sender<StreamChunk>,
    forwarded: Arc<Mutex<Forwarded>>,
    stop: CancellationToken,
) {
    // The record line holds both streams; JSON escapes a control byte as six bytes.
    let max_line = cap.saturating_mul(12).saturating_add(64 * 1024);
    let params = |t: &Target| LogParams {
        container: Some(
            if t.agent_request.is_some() {
                AGENT_CONTAINER
            } else {
                RUN_CONTAINER
            }
            .into(),
        ),
        follow: true,
        ..LogParams::default()
    };
    let mut backoff = Duration::from_millis(100);
    // Events already forwarded: a log reopened after a broken connection starts again
    // from the beginning, and these are skipped.
    let mut events_done = 0usize;
    let mut target = current_pod(&seen, &run);
    // Warm pods: the highest seq of the run's request forwarded.
    let mut agent_seq = 0u64;
    loop {
        let now = current_pod(&seen, &run);
        if now != target {
            // A retry or a warm pod: a new program run, whose output starts from the
            // beginning.
            target = now;
            events_done = 0;
            agent_seq = 0;
        }
        let name = target.pod.clone();
        let lp = params(&target);
        let opened = tokio::select! {
            _ = stop.cancelled() => return,
            r = pods.log_stream(&name, &lp) => r,
        };
        let reader = match opened {
            Ok(r) => r,
            Err(e) => {
                tracing::trace!(pod = %name, error = %e, "log not available yet");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                // Short: a streamed caller waits on this for its first output, and a
                // refused log request (pod not started yet) is cheap.
                backoff = (backoff * 2).min(Duration::from_millis(250));
                continue;
            }
        };
        let mut reader = BufReader::new(reader.compat());
        let mut line = Vec::new();
        let mut seen_here = 0usize;
        loop {
            let step = tokio::select! {
                _ = stop.cancelled() => return,
                s = read_line(&mut reader, &mut line, max_line) => s,
            };
            let last = match step {
                Ok(Line::Complete) => false,
                // The log ended without a result: the pod was lost. Follow its
                // replacement if the operator made one, else stop.
                Ok(Line::Eof) if line.is_empty() && current_pod(&seen, &run) != target => break,
                Ok(Line::Eof) if line.is_empty() => return,
                Ok(Line::Eof) => true,
                // A broken line or connection: reopen and skip what was forwarded.
                Ok(Line::TooLong) | Err(_) => break,
            };
            let Ok(event) = serde_json::from_slice::<Event>(&line) else {
                // Not a runner event (e.g. a kubelet message); nothing to forward.
                if last {
                    return;
                }
                continue;
            };
            if let Some(id) = &target.agent_request {
                // Other requests' answers, and events of ours already forwarded.
                let Ok(l) = serde_json::from_slice::<AgentLine>(&line) else {
                    continue;
                };
                if l.id.as_deref() != Some(id.as_str()) || l.seq <= agent_seq {
                    continue;
                }
                agent_seq = l.seq;
            } else {
                seen_here += 1;
                if seen_here <= events_done {
                    continue;
                }
                events_done += 1;
            }
            let chunk = {
                let mut f = forwarded.lock().expect("not poisoned");
                match event {
                    Event::Result(_) => return,
                    Event::Stdout { data } => keep_prefix(&mut f.stdout, &data, cap)
                        .map(|d| StreamChunk::Stdout(d.to_string())),
                    Event::Stderr { data } => keep_prefix(&mut f.stderr, &data, cap)
                        .map(|d| StreamChunk::Stderr(d.to_string())),
                }
            };
            // As the local backend: live output never holds anything up; a full channel
            // drops the chunk (the record has everything), a closed one ends following.
            if let Some(chunk) = chunk {
                match tx.try_send(chunk) {
                    Ok(()) | Err(TrySendError::Full(_)) => {}
                    Err(TrySendError::Closed(_)) => return,
                }
            }
            if last {
                return;
            }
        }
    }
}

/// Appends to `seen` what of `data` fits under `cap` bytes (at a character boundary) and
/// returns that part, or `None` when nothing fits.
fn keep_prefix<'a>(seen: &mut String, data: &'a str, cap: usize) -> Option<&'a str> {
    let room = cap.saturating_sub(seen.len());
    let mut end = data.len().min(room);
    while !data.is_char_boundary(end) {
        end -= 1;
    }
    if end == 0 {
        return None;
    }
    seen.push_str(&data[..end]);
    Some(&data[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_capped_per_stream_at_character_boundaries() {
        let mut seen = String::new();
        assert_eq!(keep_prefix(&mut seen, "abc", 5), Some("abc"));
        assert_eq!(keep_prefix(&mut seen, "dé", 5), Some("d"));
        assert_eq!(keep_prefix(&mut seen, "xy", 5), Some("x"));
        assert_eq!(keep_prefix(&mut seen, "z", 5), None);
        assert_eq!(seen, "abcdx");
    }
}
