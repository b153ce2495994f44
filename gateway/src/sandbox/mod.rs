//! Where untrusted code runs.
//!
//! A [`Sandbox`] takes a [`toolrun_runner::RunSpec`] plus the limits that must be enforced
//! from outside the program, runs `toolrun-runner` under isolation, forwards live output and
//! returns the runner's [`RunRecord`]. Backends: [`local`] (Linux namespaces on this machine)
//! and [`kubernetes`] (a ToolRun per call, run by the toolrun operator).

mod cgroup;
pub mod kubernetes;
mod lines;
pub mod local;

pub use kubernetes::KubernetesSandbox;
pub use local::LocalSandbox;

use async_trait::async_trait;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use toolrun_runner::{RunRecord, RunSpec};

use crate::config::Limits;
use crate::tool::StreamChunk;

/// One isolation mechanism and whether it is in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mechanism {
    /// Short name, e.g. `user-namespace`, `cgroup-v1-memory`, `seccomp`.
    pub name: String,
    /// In force for every run.
    pub active: bool,
    /// What it does or why it is missing, and what replaces it.
    pub detail: String,
}

/// What a backend reports about itself (startup log, `/readyz`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SandboxInfo {
    /// Backend name, e.g. `local`.
    pub backend: String,
    /// Mechanisms, active or not.
    pub mechanisms: Vec<Mechanism>,
}

/// One run: what the runner gets, and the limits the sandbox enforces around it.
#[derive(Debug, Clone)]
pub struct SandboxRun {
    /// Handed to `toolrun-runner` unchanged (its `limits.timeout_ms` is the program's
    /// wall-clock limit).
    pub spec: RunSpec,
    /// The language the caller named. The local backend runs `spec` as resolved by the
    /// gateway; the kubernetes backend names this language in the ToolRun and the operator
    /// resolves it from its own configuration (same names, from the same chart values).
    pub language: String,
    /// Memory, processes, /tmp size... enforced outside the runner.
    pub limits: Limits,
    /// The tool that asked for the run (e.g. `run_code`); recorded by remote backends.
    pub tool: String,
    /// The caller's call id; recorded by remote backends.
    pub call_id: String,
    /// The caller's tenant (empty: anonymous); remote backends label their runs with it.
    pub tenant: String,
    /// A session's workspace: this host directory is mounted read-write at `/workspace`
    /// (the program's working directory is then `spec.workdir`, normally `/workspace`).
    /// `None` for one-shot runs.
    ///
    /// Local backend: a plain bind mount (nosuid, nodev; not recursive, so mounts below
    /// the directory stay hidden) in the run's own mount namespace; everything else is as
    /// for a one-shot run (read-only root, private /tmp, namespaces, limits). The program
    /// writes as uid 65534 (host 65534 when the gateway is root), so the directory should
    /// be owned by it, and every directory above it must be searchable by that uid (the
    /// mount is made after the sandbox's setup process dropped to it). It must be an
    /// absolute UTF-8 path to a directory, not a symlink, chosen by the gateway; its size
    /// is what the host filesystem under it allows (a per-session filesystem or quota
    /// caps it). Such runs always start a fresh sandbox (the prepared one has no
    /// workspace). Kubernetes backend: refused ([`SandboxError::Rejected`]); it uses
    /// [`SandboxRun::session`].
    pub workspace: Option<std::path::PathBuf>,
    /// Kubernetes backend: the ToolSession this run executes in (its pod and workspace);
    /// set in the ToolRun's `spec.session` and `toolrun.dev/session` label. `None` for
    /// one-shot runs and on the local backend.
    pub session: Option<String>,
    /// Kubernetes backend: run in this container image (a custom tool's image) instead of a
    /// language's. `spec` is then a [`toolrun_runner::Language::Exec`] run: the ToolRun gets
    /// `spec.image` and `spec.command` = the interpreter followed by the args, and the
    /// operator runs it only when its `toolImages` allow the image. No session. The local
    /// backend refuses it ([`SandboxError::Rejected`]): it has no containers.
    pub image: Option<String>,
}

/// Failures of the sandbox itself (not of the program: those are verdicts in the record).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// This backend cannot run the call as asked (e.g. more stdin than a ToolRun holds):
    /// the caller's arguments must change, so it is reported as INVALID_ARGUMENTS.
    #[error("{0}")]
    Rejected(String),
    /// The sandbox could not be set up or the runner could not start.
    #[error("sandbox setup failed: {0}")]
    Setup(String),
    /// The runner ended without a valid result record.
    #[error("runner protocol error: {0}")]
    Protocol(String),
    /// I/O with the sandboxed process failed.
    #[error("sandbox i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// A backend that runs code in isolation.
#[async_trait]
pub trait Sandbox: Send + Sync + 'static {
    /// Backend name and active mechanisms.
    fn info(&self) -> SandboxInfo;

    /// Runs one program to completion.
    ///
    /// - Live output goes to `stream` when given (at most the output limit per stream).
    /// - When `cancel` fires, every process of the run is killed and the record's verdict
    ///   is `CANCELLED`.
    /// - Nothing of the run survives this call: every process, mount and file is gone
    ///   when it returns, whatever the program did.
    async fn run(
        &self,
        run: SandboxRun,
        stream: Option<mpsc::Sender<StreamChunk>>,
        cancel: CancellationToken,
    ) -> Result<RunRecord, SandboxError>;

    /// Time a run may take before its program starts (scheduling a pod, pulling an
    /// image), on top of the program's own timeout. The executor waits this much longer
    /// for a sandboxed tool before giving up on it. Local: none.
    fn start_allowance(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

/// The runner-enforced part of `limits` for a program with this wall-clock timeout.
///
/// RLIMIT_NPROC counts the runner's own tasks too (same uid inside the sandbox), hence
/// the [`local::RUNNER_TASKS`] headroom; the pids cgroup is the real process limit.
pub fn runner_limits(limits: &Limits, timeout_ms: u64) -> toolrun_runner::RunnerLimits {
    toolrun_runner::RunnerLimits {
        timeout_ms,
        output_limit_bytes: limits.output_limit_bytes,
        cpu_seconds: limits.cpu_seconds,
        max_processes: limits.max_processes + local::RUNNER_TASKS,
        max_file_bytes: limits.max_file_size_mb << 20,
        max_open_files: limits.max_open_files,
        address_space_bytes: 0,
    }
}
