//! Steps 3 and 4 of a run: reap (the setup process, the runner's diagnostics, the
//! cgroups) and verdict (the runner's record, corrected for memory, or a synthetic one).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use toolrun_runner::{PROTOCOL_VERSION, RunRecord, Verdict};

use super::BACKSTOP_SLACK;
use super::pump::{Attached, Ending, Pumped};
use super::shape::RunShape;
use crate::sandbox::SandboxError;
use crate::sandbox::cgroup::{MemoryEvents, RunCgroup};

/// Kills and removes what is left of a run, also when the `run` future is dropped.
pub(super) struct RunGuard {
    pub cg: Option<Arc<RunCgroup>>,
    pub child_pid: Option<i32>,
    /// Set once the run is handed on (to a later guard or to [`reap`]): dropping does
    /// nothing then.
    pub done: bool,
}

impl RunGuard {
    pub fn new(cg: Option<Arc<RunCgroup>>, child_pid: Option<i32>) -> RunGuard {
        RunGuard {
            cg,
            child_pid,
            done: false,
        }
    }

    pub fn kill(&self) {
        match &self.cg {
            Some(cg) => cg.kill_all(),
            None => {
                // Without cgroups: the setup process; the runner (PID 1) has it as its
                // parent-death signal, and the kernel kills its namespace with it.
                if let Some(pid) = self.child_pid.and_then(rustix::process::Pid::from_raw) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
        }
    }

    pub fn cleanup_blocking(cg: Option<Arc<RunCgroup>>) {
        if let Some(cg) = cg {
            match Arc::try_unwrap(cg) {
                Ok(cg) => {
                    cg.remove();
                }
                Err(cg) => cg.kill_all(),
            }
        }
    }
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.kill();
        let cg = self.cg.take();
        let _ = std::thread::Builder::new()
            .name("sandbox-cleanup".into())
            .spawn(move || RunGuard::cleanup_blocking(cg));
    }
}

/// What reaping found.
pub(super) struct Reaped {
    /// The setup process's exit reason; `None` when it did not exit in time (killed).
    pub status: Option<String>,
    /// The runner's own stderr (diagnostics).
    pub runner_stderr: String,
    /// The run's memory events (OOM kills, limit hits).
    pub memory: MemoryEvents,
}

/// Kills the run when the gateway ends it (`killed`: cancel, backstop, broken protocol),
/// waits for the setup process (it exits right after the runner, PID 1), collects the
/// runner's diagnostics and memory events, and removes the run's cgroups: off the call's
/// path when every process is known gone, else on it, killing until the groups are empty.
///
/// When the runner ends by itself, its parent (the setup process) can only reap it once
/// the kernel has emptied its PID namespace, so the setup process's exit means every
/// process is gone. When the gateway kills the run, the setup process dies at once while
/// the namespace is still being torn down (and a process forked during the kill pass
/// missed it): only empty cgroups prove that nothing of the run is left.
pub(super) async fn reap(
    mut guard: RunGuard,
    status: oneshot::Receiver<hakoniwa::Result<String>>,
    io: Attached,
    killed: bool,
) -> Result<Reaped, SandboxError> {
    if killed {
        guard.kill();
    }
    io.writer.abort();
    let status = match tokio::time::timeout(Duration::from_secs(5), status).await {
        Ok(Ok(Ok(reason))) => Some(reason),
        _ => {
            guard.kill();
            None
        }
    };
    let runner_stderr = match tokio::time::timeout(Duration::from_secs(1), io.diag).await {
        Ok(Ok(text)) => text,
        _ => String::new(),
    };
    let cg_final = guard.cg.take();
    guard.done = true;
    let memory = cg_final
        .as_ref()
        .map(|c| c.memory_events())
        .unwrap_or_default();
    if status.is_some() && !killed {
        // Every process of the run is gone (the setup process was the last): removing
        // the empty groups is bookkeeping, off the call's path.
        let _ = std::thread::Builder::new()
            .name("sandbox-cleanup".into())
            .spawn(move || RunGuard::cleanup_blocking(cg_final));
    } else {
        tokio::task::spawn_blocking(move || RunGuard::cleanup_blocking(cg_final))
            .await
            .map_err(|e| SandboxError::Setup(format!("cleanup task: {e}")))?;
    }
    Ok(Reaped {
        status,
        runner_stderr,
        memory,
    })
}

/// The call's answer: the runner's record (MEMORY_LIMIT when the cgroup says so), or a
/// synthetic record when the gateway ended the run (cancel, backstop, OOM-broken output),
/// or a protocol error.
pub(super) fn verdict(
    pumped: Pumped,
    reaped: Reaped,
    shape: &RunShape,
    timeout_ms: u64,
    elapsed_ms: u64,
) -> Result<RunRecord, SandboxError> {
    let Pumped {
        ending,
        record,
        out_seen,
        err_seen,
    } = pumped;
    let memory = reaped.memory;
    let synth = |verdict: Verdict, timed_out: bool, message: String| RunRecord {
        version: PROTOCOL_VERSION,
        verdict,
        exit_code: 137,
        signal: Some(9),
        stdout: out_seen.clone(),
        stderr: err_seen.clone(),
        stdout_truncated: false,
        stderr_truncated: false,
        timed_out,
        duration_ms: elapsed_ms,
        message,
        artifacts: None,
    };
    let oom_message = || {
        format!(
            "memory limit of {} MiB exceeded (killed by the OOM killer)",
            shape.memory_mb
        )
    };
    match ending {
        Ending::Cancelled => Ok(synth(
            Verdict::Cancelled,
            false,
            "cancelled by the caller".into(),
        )),
        Ending::Backstop => Ok(synth(
            Verdict::Timeout,
            true,
            format!(
                "the sandbox did not finish within the {} ms timeout plus {} s; killed from outside",
                timeout_ms,
                BACKSTOP_SLACK.as_secs()
            ),
        )),
        Ending::Protocol(msg) if memory.oom_kills > 0 => {
            tracing::debug!(%msg, "runner output broken after an OOM kill");
            Ok(synth(Verdict::MemoryLimit, false, oom_message()))
        }
        Ending::Protocol(msg) => Err(SandboxError::Protocol(msg)),
        Ending::Eof => match record {
            Some(rec) => Ok(correct_for_memory(rec, memory, &oom_message)),
            None if memory.oom_kills > 0 => Ok(synth(Verdict::MemoryLimit, false, oom_message())),
            None => {
                let reason = reaped.status.unwrap_or_default();
                Err(SandboxError::Protocol(format!(
                    "runner ended without a result record ({reason}): {}",
                    reaped.runner_stderr.trim()
                )))
            }
        },
    }
}

/// The runner cannot tell an OOM kill from another SIGKILL, nor a MemoryError from another
/// exception; the run's memory cgroup can. A failed run whose group hit its limit
/// (OOM kill, or an allocation refused at the limit) is MEMORY_LIMIT.
fn correct_for_memory(
    mut rec: RunRecord,
    memory: MemoryEvents,
    message: &dyn Fn() -> String,
) -> RunRecord {
    let failed = matches!(rec.verdict, Verdict::RuntimeError | Verdict::InfraError);
    if failed && (memory.oom_kills > 0 || memory.failcnt > 0) {
        rec.verdict = Verdict::MemoryLimit;
        rec.message = message();
    }
    rec
}
