//! Following the `run` container's log of a running pod, to record the result the moment
//! the runner writes it instead of when the kubelet notices the container exit (up to a
//! second later: its generic PLEG relists once a second).
//!
//! The runner writes its one `result` line when the program ends and exits right after
//! it; the program cannot write to the runner's stdout (its streams are pipes to the
//! runner), so a line that parses as a result event is the runner's record. A follower
//! is a task streaming the log (`follow=true`) of one pod; when it reads the record it
//! keeps it under the pod's UID and triggers a reconcile of the run, which records it
//! through [`crate::toolrun::decide::Decision::Record`] exactly as from a finished pod.
//!
//! Followers are an optimisation only: one that fails, ends without a record or is
//! never started (past `controller.maxLogFollowers`) changes nothing, because the
//! finished-pod path still reads the whole log. At most one follower per pod UID ever
//! runs in a term of leadership; a line longer than the cap (outputBytes * 2 + 64 KiB)
//! ends it, so a follower holds at most that many bytes.

use std::sync::Arc;

use futures::channel::mpsc::UnboundedReceiver;
use futures::io::{AsyncBufRead, AsyncBufReadExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::LogParams;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use toolrun_crd::ToolRun;
use toolrun_runner::RunRecord;
use tracing::debug;

use crate::reconcile::{PodTasks, Refused};
use crate::toolrun::builders::RUN_CONTAINER;
use crate::toolrun::record::{RecordError, record_from_log};

/// Slack on top of twice the run's outputBytes for one log line: the record carries both
/// streams (each capped at outputBytes by the runner) plus JSON escaping and fields.
pub const LINE_SLACK_BYTES: usize = 64 * 1024;

/// The longest log line a follower of a run with `output_bytes` holds.
pub fn line_cap(output_bytes: u32) -> usize {
    (output_bytes as usize)
        .saturating_mul(2)
        .saturating_add(LINE_SLACK_BYTES)
}

/// Why a follower stopped without a record (logged only: the finished-pod path decides).
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    /// The log request or the stream failed.
    #[error("reading the log: {0}")]
    Read(String),
    /// The stream ended (the container exited, or the connection closed) before a record.
    #[error("the log ended without a result record")]
    Ended,
    /// A line grew past the cap.
    #[error("a log line is longer than {0} bytes")]
    LineTooLong(usize),
    /// A result line that is not a usable record (malformed, other protocol version).
    #[error(transparent)]
    Record(RecordError),
}

/// Reads JSON lines from `log` until the runner's result record; holds at most `cap`
/// bytes of one line (a longer line is [`FollowError::LineTooLong`]).
pub async fn scan_for_record<R: AsyncBufRead + Unpin>(
    mut log: R,
    cap: usize,
) -> Result<RunRecord, FollowError> {
    let mut line: Vec<u8> = Vec::new();
    loop {
        let buf = log
            .fill_buf()
            .await
            .map_err(|e| FollowError::Read(e.to_string()))?;
        if buf.is_empty() {
            // A complete object at the very end (no newline) still counts: a cut line
            // does not parse.
            return match parse_line(&line)? {
                Some(record) => Ok(record),
                None => Err(FollowError::Ended),
            };
        }
        let (take, complete) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        if line.len() + take > cap {
            return Err(FollowError::LineTooLong(cap));
        }
        line.extend_from_slice(&buf[..take]);
        log.consume_unpin(take + usize::from(complete));
        if complete {
            if let Some(record) = parse_line(&line)? {
                return Ok(record);
            }
            line.clear();
        }
    }
}

/// The record if `line` is the runner's result line; `None` for any other line.
fn parse_line(line: &[u8]) -> Result<Option<RunRecord>, FollowError> {
    let Ok(text) = std::str::from_utf8(line) else {
        return Ok(None);
    };
    match record_from_log(text) {
        Ok(record) => Ok(Some(record)),
        Err(RecordError::Empty | RecordError::NoResult(_)) => Ok(None),
        Err(e) => Err(FollowError::Record(e)),
    }
}

/// The log followers of this replica: per pod UID, the record read (`None` when the
/// follower ended without one).
pub struct Followers {
    max: usize,
    tasks: PodTasks<ToolRun, Option<RunRecord>>,
}

impl Followers {
    /// At most `max` following at once (0: never follow) in `namespace`.
    pub fn new(max: usize, namespace: String) -> Self {
        Followers {
            max,
            tasks: PodTasks::new(namespace),
        }
    }

    /// Begins a term of leadership: followers may start; the stream triggers reconciles
    /// of runs whose record was read.
    pub fn start_term(&self) -> UnboundedReceiver<ObjectRef<ToolRun>> {
        self.tasks.start_term()
    }

    /// Ends the term: every follower stops, records not yet used are dropped (the
    /// finished-pod path reads them again).
    pub fn end_term(&self) {
        self.tasks.end_term();
    }

    /// The record read from the live log of the pod with `pod_uid`, if any.
    pub fn record(&self, pod_uid: &str) -> Option<RunRecord> {
        self.tasks.outcome(pod_uid).flatten()
    }

    /// Followers still reading.
    pub fn live(&self) -> usize {
        self.tasks.live()
    }

    /// Stops and forgets the followers of the run `run` (finished, deleted).
    pub fn forget_run(&self, run: &str) {
        self.tasks.forget_run(run);
    }

    /// Starts following the `run` container of `pod` (of the ToolRun `run`) unless it is
    /// or was followed in this term, no term is on, or `max` followers are reading.
    /// Returns whether a follower was started.
    pub fn follow(self: &Arc<Self>, pods: &Api<Pod>, run: &str, pod: &Pod, cap: usize) -> bool {
        let Some(uid) = pod.metadata.uid.clone() else {
            return false;
        };
        let pod_name = pod.name_any();
        let cancel = match self.tasks.begin(&uid, run, self.max) {
            Ok(cancel) => cancel,
            Err(Refused::Full) => {
                debug!(run, pod = %pod_name, max = self.max, "maxLogFollowers reached; the finished pod's log will be read");
                return false;
            }
            Err(_) => return false,
        };
        let followers = Arc::clone(self);
        let pods = pods.clone();
        let run = run.to_string();
        tokio::spawn(async move {
            let read = async {
                let lp = LogParams {
                    container: Some(RUN_CONTAINER.into()),
                    follow: true,
                    ..LogParams::default()
                };
                let log = pods
                    .log_stream(&pod_name, &lp)
                    .await
                    .map_err(|e| FollowError::Read(e.to_string()))?;
                scan_for_record(Box::pin(log), cap).await
            };
            let outcome = tokio::select! {
                _ = cancel.cancelled() => return,
                outcome = read => outcome,
            };
            match &outcome {
                Ok(_) => debug!(%run, pod = %pod_name, "read the record from the live log"),
                Err(e) => {
                    debug!(%run, pod = %pod_name, error = %e, "log follower ended without a record")
                }
            }
            let record = outcome.ok();
            let found = record.is_some();
            followers.tasks.ended(&uid, &run, record, found);
        });
        true
    }
}

#[cfg(test)]
mod tests;
