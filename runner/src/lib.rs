//! The runner protocol: what `toolrun-runner` reads and what it writes.
//!
//! The same binary runs inside the local sandbox and inside Kubernetes pods, so this
//! crate is the single definition of the run specification and of the record format.
//!
//! ## Input: [`RunSpec`]
//! `toolrun-runner --spec PATH` reads one JSON [`RunSpec`] from `PATH` (`-` = its stdin).
//!
//! ## Output: JSON Lines on the runner's stdout
//! One [`Event`] per line, tagged by `"event"`:
//! - `{"event":"stdout","data":"..."}` / `{"event":"stderr","data":"..."}`: output chunks as
//!   they are produced (UTF-8; a multi-byte character is never split between chunks; invalid
//!   bytes become U+FFFD). Only the first `output_limit_bytes` of each stream are forwarded.
//! - exactly one final `{"event":"result", ...}` line: the [`RunRecord`].
//!
//! Anything the runner itself fails at (bad spec, interpreter not found) still ends with a
//! result line whose verdict is `INFRA_ERROR` and whose `message` says why.
//!
//! ## What the runner enforces itself
//! The program's environment is exactly `env`; it gets fds 0-2 only; rlimits from
//! `limits` (0 = unset; RLIMIT_CORE is always 0); the [`seccomp`] deny-list; the
//! wall-clock timeout; the per-stream output cap. When the program ends, times out or
//! overflows, every process it started is killed (`kill(-1)` as PID 1 of a PID namespace,
//! else its process group and every descendant, the runner being their subreaper) before
//! the record is written. The runner is non-dumpable, so the program (same uid) can
//! neither ptrace it nor write into its stdout through /proc.
//!
//! ## Agent mode
//! `toolrun-runner agent` serves many requests (runs, file operations) over stdin/stdout as
//! the long-lived PID 1 of a pod; each run is executed by this one-shot mode. See [`agent`].
//!
//! ## Fail closed: the API server must stay unreachable
//! `--require-unreachable HOST:PORT|auto|off` (or `TOOLRUN_REQUIRE_UNREACHABLE`; default off
//! in one-shot mode, `auto` in agent mode) refuses to run (`INFRA_ERROR` naming the cause)
//! while that address, by default the API server, is reachable: see [`agent::reach`]. Once
//! that first check passed, the address is checked again every `--recheck-interval-ms`
//! (or `TOOLRUN_RECHECK_INTERVAL_MS`; default 1000, 0: never) while the program runs (in
//! agent mode: for as long as the agent lives); the first connect that succeeds kills the
//! program and everything it started, and the record is `INFRA_ERROR` ("... became reachable
//! from the sandbox ... the running program was killed") with the output captured so far.
//!
//! ## Setup files and artifacts
//! Before the program starts the runner writes `setup.files` (under `/tmp/` only: a
//! configured language's source, python's matplotlib backend) and creates the outputs
//! directory; after every process of the run is gone it collects that directory's files
//! into the record's `artifacts` ([`artifacts`]), bounded by the spec.
//!
//! ## Verdicts
//! TIMEOUT (wall clock: `timed_out`; CPU rlimit: SIGXCPU, or SIGKILL after the CPU limit,
//! message says CPU time), OUTPUT_LIMIT (a stream passed the cap; the program was
//! killed), RUNTIME_ERROR (non-zero exit or a signal; `exit_code` = status or
//! 128 + signal), MEMORY_LIMIT (the `oom_kill` counter of the runner's own memory cgroup
//! rose during the run, see [`oom`]: how a pod's OOM kill of the program shows), OK.
//! Where no counter is readable the runner cannot tell an OOM kill from another SIGKILL,
//! nor a MemoryError from another exception: the backend that owns the memory limit
//! corrects RUNTIME_ERROR to MEMORY_LIMIT (the local sandbox reads its memory cgroup).

pub mod agent;
pub mod artifacts;
pub mod capture;
pub mod interp;
pub mod oom;
pub mod run;
pub mod seccomp;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Version of the record format; bumped on incompatible changes.
pub const PROTOCOL_VERSION: u32 = 1;

/// A language the runner knows how to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// `python3 -c CODE ARGS...` (the interpreter path comes from the spec).
    Python,
    /// `node -e CODE ARGS...`
    Javascript,
    /// `bash -c CODE bash ARGS...`
    Bash,
    /// `INTERPRETER ARGS...`: no interpreter and no code; `interpreter` is the program
    /// itself (a custom tool's image command: its first element here, the rest first in
    /// `args`), an absolute path or a name looked up on the run's own `PATH`. `code` is
    /// ignored.
    Exec,
}

impl Language {
    /// Lowercase name, as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Javascript => "javascript",
            Language::Bash => "bash",
            Language::Exec => "exec",
        }
    }
}

/// Limits the runner enforces itself (the sandbox around it enforces the rest).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunnerLimits {
    /// Wall-clock limit for the program, in milliseconds.
    pub timeout_ms: u64,
    /// Bytes kept per stream (stdout, stderr); more is cut and flagged.
    pub output_limit_bytes: u64,
    /// RLIMIT_CPU seconds for the program (0 = not set by the runner).
    #[serde(default)]
    pub cpu_seconds: u64,
    /// RLIMIT_NPROC for the program (0 = not set by the runner).
    #[serde(default)]
    pub max_processes: u64,
    /// RLIMIT_FSIZE bytes (0 = not set by the runner).
    #[serde(default)]
    pub max_file_bytes: u64,
    /// RLIMIT_NOFILE (0 = not set by the runner).
    #[serde(default)]
    pub max_open_files: u64,
    /// RLIMIT_AS bytes (0 = not set; prefer a cgroup memory limit outside the runner).
    #[serde(default)]
    pub address_space_bytes: u64,
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    /// Interpreter language.
    pub language: Language,
    /// Program source.
    pub code: String,
    /// Arguments passed to the program.
    #[serde(default)]
    pub args: Vec<String>,
    /// The program's whole environment (nothing else is inherited).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Bytes written to the program's stdin, then closed.
    #[serde(default)]
    pub stdin: String,
    /// Absolute path of the interpreter inside the sandbox (for [`Language::Exec`], the
    /// program: an absolute path or a name on `env`'s `PATH`).
    pub interpreter: String,
    /// Working directory inside the sandbox.
    #[serde(default = "default_workdir")]
    pub workdir: String,
    /// Limits the runner enforces.
    pub limits: RunnerLimits,
    /// Files written before the program starts and artifacts collected after it ends.
    #[serde(default, skip_serializing_if = "RunSetup::is_empty")]
    pub setup: RunSetup,
}

/// The code-interpreter parts of a run: files the runner writes before starting the program
/// (the source of a configured language, helper modules), and the outputs directory whose
/// files come back as artifacts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSetup {
    /// Written (created with their parent directories, mode 0644) before the program starts;
    /// each path must be absolute and under `/tmp/`.
    #[serde(default)]
    pub files: Vec<SetupFile>,
    /// Where the program's output files are collected from after it ends.
    #[serde(default)]
    pub artifacts: Option<artifacts::ArtifactSpec>,
}

impl RunSetup {
    /// Nothing to write or collect.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.artifacts.is_none()
    }
}

/// One file written before the program starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetupFile {
    /// Absolute path under `/tmp/`.
    pub path: String,
    /// UTF-8 content.
    pub content: String,
}

fn default_workdir() -> String {
    "/tmp".to_string()
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Verdict {
    /// Exited 0 within its limits.
    Ok,
    /// Exited non-zero or was killed by a signal it caused.
    RuntimeError,
    /// Hit the wall-clock or CPU-time limit.
    Timeout,
    /// Hit the memory limit.
    MemoryLimit,
    /// Wrote more than the output limit on a stream and was stopped.
    OutputLimit,
    /// Cancelled by the caller.
    Cancelled,
    /// The sandbox or runner failed; the program's behaviour is unknown.
    InfraError,
}

impl Verdict {
    /// SCREAMING_SNAKE_CASE name, as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "OK",
            Verdict::RuntimeError => "RUNTIME_ERROR",
            Verdict::Timeout => "TIMEOUT",
            Verdict::MemoryLimit => "MEMORY_LIMIT",
            Verdict::OutputLimit => "OUTPUT_LIMIT",
            Verdict::Cancelled => "CANCELLED",
            Verdict::InfraError => "INFRA_ERROR",
        }
    }
}

/// The final record of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    /// [`PROTOCOL_VERSION`] of the writer.
    pub version: u32,
    /// How the run ended.
    pub verdict: Verdict,
    /// Exit status; for a signal death, 128 + signal number (shell convention).
    pub exit_code: i32,
    /// The terminating signal, if any.
    #[serde(default)]
    pub signal: Option<i32>,
    /// Captured stdout (at most `output_limit_bytes`, lossy UTF-8).
    pub stdout: String,
    /// Captured stderr (at most `output_limit_bytes`, lossy UTF-8).
    pub stderr: String,
    /// stdout was cut at the limit.
    pub stdout_truncated: bool,
    /// stderr was cut at the limit.
    pub stderr_truncated: bool,
    /// The wall-clock limit was hit.
    pub timed_out: bool,
    /// Wall-clock duration of the program, in milliseconds.
    pub duration_ms: u64,
    /// Human-readable reason for a non-OK verdict (empty when OK).
    #[serde(default)]
    pub message: String,
    /// The files found in the outputs directory after the run (when the spec asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifacts: Option<artifacts::Artifacts>,
}

/// One line of the runner's output stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Event {
    /// A chunk of the program's stdout.
    Stdout {
        /// The text.
        data: String,
    },
    /// A chunk of the program's stderr.
    Stderr {
        /// The text.
        data: String,
    },
    /// The final record.
    Result(RunRecord),
}

impl Event {
    /// Parses one JSON line.
    pub fn parse(line: &str) -> Result<Event, serde_json::Error> {
        serde_json::from_str(line)
    }

    /// Serialises to one JSON line, with the trailing newline.
    pub fn to_line(&self) -> String {
        let mut s = serde_json::to_string(self).expect("events always serialise");
        s.push('\n');
        s
    }
}
