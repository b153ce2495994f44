//! Step 2 of a run, pump: hand the runner its spec, read its JSON lines with bounded
//! memory, forward live chunks, keep what the caller saw (for synthetic records).

use std::io::{PipeReader, PipeWriter};

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolrun_runner::{Event, RunRecord, RunSpec};

use super::MAX_RUNNER_STDERR;
use crate::sandbox::SandboxError;
use crate::sandbox::lines::{Line, read_line};
use crate::tool::StreamChunk;

/// How the read loop ended.
pub(super) enum Ending {
    /// The runner closed its stdout.
    Eof,
    /// The caller cancelled.
    Cancelled,
    /// The timeout plus [`BACKSTOP_SLACK`](super::BACKSTOP_SLACK) passed.
    Backstop,
    /// The runner wrote something that is not the protocol.
    Protocol(String),
}

/// What the pump saw.
pub(super) struct Pumped {
    pub ending: Ending,
    /// The runner's result record, when it wrote one.
    pub record: Option<RunRecord>,
    /// Stdout and stderr as streamed, up to the output limit each.
    pub out_seen: String,
    pub err_seen: String,
}

/// The runner's stdin and stderr, attached to the runtime: the spec is being written to
/// its stdin, its stderr (diagnostics) is being collected. Its stdout is for [`pump`].
pub(super) struct Attached {
    /// Writes the spec; aborted once the pump ends.
    pub writer: JoinHandle<()>,
    /// The runner's own stderr, at most [`MAX_RUNNER_STDERR`] bytes.
    pub diag: JoinHandle<String>,
}

impl Attached {
    /// Attaches the pipes; returns the runner's stdout for [`pump`].
    pub fn start(
        spec: &RunSpec,
        stdin: PipeWriter,
        stdout: PipeReader,
        stderr: PipeReader,
    ) -> Result<(pipe::Receiver, Attached), SandboxError> {
        let mut stdin = pipe::Sender::from_owned_fd(stdin.into())?;
        let stdout = pipe::Receiver::from_owned_fd(stdout.into())?;
        let mut stderr = pipe::Receiver::from_owned_fd(stderr.into())?;
        let spec_json =
            serde_json::to_vec(spec).map_err(|e| SandboxError::Setup(format!("spec: {e}")))?;
        let writer = tokio::spawn(async move {
            let _ = stdin.write_all(&spec_json).await;
        });
        let diag = tokio::spawn(async move {
            let mut kept = Vec::new();
            let mut buf = vec![0u8; 8192];
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let room = MAX_RUNNER_STDERR.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
            String::from_utf8_lossy(&kept).into_owned()
        });
        Ok((stdout, Attached { writer, diag }))
    }
}

/// Reads the runner's events until it closes stdout, the caller cancels, the backstop
/// passes, or the protocol breaks. `cap` is the output limit per stream; `artifacts` the
/// most the record's artifacts may add to its line.
pub(super) async fn pump(
    stdout: pipe::Receiver,
    mut stream: Option<mpsc::Sender<StreamChunk>>,
    cancel: &CancellationToken,
    backstop: Instant,
    cap: usize,
    artifacts: usize,
) -> Pumped {
    // The record line holds both streams; JSON escapes a control byte as six bytes.
    let max_line = cap
        .saturating_mul(12)
        .saturating_add(64 * 1024)
        .saturating_add(artifacts);
    let mut reader = BufReader::with_capacity(64 * 1024, stdout);
    let mut line = Vec::new();
    let mut record: Option<RunRecord> = None;
    let (mut out_seen, mut err_seen) = (String::new(), String::new());
    let mut dropped_chunks = 0u64;
    let ending = loop {
        let step = tokio::select! {
            biased;
            _ = cancel.cancelled() => break Ending::Cancelled,
            _ = tokio::time::sleep_until(backstop) => break Ending::Backstop,
            step = read_line(&mut reader, &mut line, max_line) => step,
        };
        let last = match step {
            Ok(Line::Complete) => false,
            Ok(Line::Eof) if line.is_empty() => break Ending::Eof,
            Ok(Line::Eof) => true,
            Ok(Line::TooLong) => {
                break Ending::Protocol(format!("runner line longer than {max_line} bytes"));
            }
            Err(e) => break Ending::Protocol(format!("reading runner output: {e}")),
        };
        let event = match serde_json::from_slice::<Event>(&line) {
            Ok(ev) => ev,
            Err(e) => break Ending::Protocol(format!("invalid runner event: {e}")),
        };
        let chunk = match event {
            Event::Result(r) => {
                record = Some(r);
                None
            }
            Event::Stdout { data } => {
                keep_prefix(&mut out_seen, &data, cap);
                Some(StreamChunk::Stdout(data))
            }
            Event::Stderr { data } => {
                keep_prefix(&mut err_seen, &data, cap);
                Some(StreamChunk::Stderr(data))
            }
        };
        // Live output never slows the run: a full channel drops the chunk (the record
        // still has everything), a closed one stops forwarding.
        if let (Some(chunk), Some(tx)) = (chunk, &stream) {
            match tx.try_send(chunk) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => dropped_chunks += 1,
                Err(TrySendError::Closed(_)) => stream = None,
            }
        }
        if last {
            break Ending::Eof;
        }
    };
    if dropped_chunks > 0 {
        tracing::debug!(
            dropped_chunks,
            "stream receiver too slow; live chunks dropped"
        );
    }
    Pumped {
        ending,
        record,
        out_seen,
        err_seen,
    }
}

/// Appends `data` to `seen` up to `cap` bytes (at a character boundary).
fn keep_prefix(seen: &mut String, data: &str, cap: usize) {
    let room = cap.saturating_sub(seen.len());
    if room == 0 {
        return;
    }
    let mut end = data.len().min(room);
    while !data.is_char_boundary(end) {
        end -= 1;
    }
    seen.push_str(&data[..end]);
}
