//! `toolrun-runner agent`: the in-pod agent. PID 1 of a long-lived pod (a session, or a warm
//! sandbox), reached only through the Kubernetes API (`pods/attach`), so its stdin and stdout
//! are the attach stream: no pod network, no listening socket.
//!
//! # Protocol (version [`proto::AGENT_PROTOCOL_VERSION`])
//!
//! **Framing.** JSON Lines both ways: one JSON object per `\n`-terminated line, UTF-8. A
//! request line is at most `--max-line-bytes` (default 24 MiB, so a 16 MiB `write_file` in
//! base64, 21.4 MiB, fits); a longer one is read to its end, dropped and answered
//! `LINE_TOO_LONG`. Types: [`proto::Request`] in, [`proto::Response`] out;
//! [`client`] has the codec and a sequence tracker for clients.
//!
//! **Requests** `{"id": ID, "op": OP, ...fields}`: `id` is chosen by the client (1 to 256
//! bytes, unique per request: a UUID or a call id).
//!
//! | op | fields | events |
//! |----|--------|--------|
//! | `hello`, `status` | | `ok` with a [`proto::Status`] (versions, uptime, requests served, active run, queue, workspace, isolation, results held) |
//! | `run` | `spec`: a [`crate::RunSpec`] | `stdout`/`stderr` chunks, then `result` (a [`crate::RunRecord`]) |
//! | `read_file`, `write_file`, `list_directory`, `delete_file`, `move_file`, `glob`, `grep`, `edit` | `args`: the tool's arguments as `toolrun_workspace` defines them | `ok` with the tool's output, or `error` |
//! | `exists`, `resolve_dir` | `args`: `{"path": ...}` | `ok` `{"exists": bool}` / `{"path": rel}`, or `error` |
//! | `preview_write`, `preview_edit` | `args`: write_file's / edit's arguments | `ok` `{"diff": ...}`, or `error` |
//! | `usage` | `args`: `{}` | `ok` `{"bytesUsed", "filesUsed", "bytesLimit", "filesLimit", "truncated"}` (`toolrun_workspace::UsageOutput`), or `error` |
//! | `kill` | `target`: a run's id | `ok` `{"state": "queued"\|"running"\|"finished"\|"file_op"}`; the run ends `CANCELLED` |
//! | `resume` | `target`, `after_seq` | the target's missed events, then `ok` `{"state", "replayed"}` |
//! | `ack` | `targets`: ids | `ok` `{"forgotten": n}` |
//!
//! **Responses** `{"id": ID, "seq": N, "event": EVENT, ...fields}`. `seq` numbers the events
//! of one request from 1; the final event (`result`, `ok` or `error`) has the highest. Events:
//! `stdout`/`stderr` `{data}`, `result` {the record's fields}, `ok` `{output}`, `error`
//! `{code, message, details?}`, `lost` `{first_seq, last_seq}` (those events were dropped
//! from the replay buffer; its own seq is `last_seq`). Control ops (`hello`, `status`,
//! `kill`, `resume`, `ack`) answer with one event of seq 1. An error about a line itself (not
//! JSON, no id, too long, unknown op, bad fields, id conflict, expired id) has `seq` 0 and
//! the id when it could be read (else null). Error codes: [`proto::ErrorCode`]: the file
//! core's (`INVALID_PATH`, `FILE_NOT_FOUND`, `ALREADY_EXISTS`, `NOT_A_DIRECTORY`,
//! `IS_A_DIRECTORY`, `NO_MATCH`, `AMBIGUOUS_MATCH`, `QUOTA_EXCEEDED`, `PERMISSION_DENIED`,
//! `INVALID_ARGUMENTS`, `EXECUTION_ERROR`) and the agent's (`BAD_REQUEST`, `LINE_TOO_LONG`,
//! `UNKNOWN_OP`, `ID_CONFLICT`, `RESULT_EXPIRED`, `UNKNOWN_TARGET`, `NO_WORKSPACE`).
//! Events of different requests interleave; each request's events are in seq order.
//!
//! **Idempotency.** Runs and file ops are remembered by id and executed at most once. A
//! repeated request (same id, same content) is not executed again: if it finished, its
//! stored final event is sent again; if it is in flight, its buffered events are sent again
//! from seq 1 and its live events follow. The same id with other content is `ID_CONFLICT`.
//! Finished results are kept in a table bounded by `--max-results` (default 1024) and
//! `--max-result-bytes` (default 64 MiB of final lines; the newest result is always kept);
//! `ack` frees them early. An evicted or acknowledged id is remembered (the last 65,536
//! such ids) and answered `RESULT_EXPIRED`, never run again. A finished run keeps only its
//! final `result` event, which holds all its output.
//!
//! **Reconnection.** Each in-flight request keeps its events in a replay buffer (at most
//! `--max-replay-bytes`, default 8 MiB; the oldest are dropped first and reported as
//! `lost`). A client that reconnects sends `hello`, then `resume {target, after_seq}` for each
//! request it was waiting on, with the highest seq it has: it gets the events after it (a
//! finished request: its final event, if after_seq is below it), then `ok`, then the live
//! events. Replayed and live events may overlap or arrive out of order (live events that
//! overtook a replay): the client drops any seq it already has and holds events after a gap
//! until the replay fills it ([`client::Tracker`] does both and releases events in order). stdout is written by one thread from a queue: with no reader
//! (EPIPE) the lines are dropped and counted (`lines_dropped`), and a reader that is too
//! slow (queue above 64 MiB) loses chunk events, never final ones; neither stops the agent
//! or a run. On end of stdin the agent keeps running (runs go on, results stay) and reads
//! stdin again every 200 ms: the FIFO behind a container's stdin (`stdin: true`,
//! `stdinOnce: false`) delivers the next attach's requests. A line cut when a reader
//! detached may reach the next reader: clients skip lines they cannot decode.
//!
//! **Usage.** `usage` walks the workspace on a file worker (one filesystem, symlinks never
//! followed, each hard-linked inode once, at most the core's `max_walk_entries` entries:
//! `truncated` then says the used figures are lower bounds) and reports allocated bytes and
//! entries used, with the limits: `bytesLimit` is `--workspace-limit-bytes` (the operator
//! sets the session's size: an emptyDir's `sizeLimit` is not visible to statvfs, which shows
//! the node's disk) or the filesystem's size when that is smaller (a claim), `filesLimit`
//! the filesystem's inodes.
//!
//! **Runs.** One program at a time: runs queue in arrival order; file ops run concurrently
//! on `--file-workers` threads (default 4), also during a run. Each run is executed by the
//! one-shot runner (the agent's own executable with `--spec -`), see [`runs`]: the same
//! capture, limits, seccomp filter, verdicts and record. `limits.output_limit_bytes` above
//! `--max-output-bytes` (default 16 MiB) is refused (`INVALID_ARGUMENTS`). Before each run
//! the pod is cleaned ([`cleanup`]): every process but the agent killed, the scratch
//! directories (`--scratch DIR`, repeatable; default /tmp and /dev/shm when the agent is PID
//! 1, none otherwise) emptied, System V IPC removed (default when PID 1; `--clean-ipc`
//! otherwise, only in a private IPC namespace). Processes are killed again right after each
//! run. `--no-cleanup` turns all of it off (tests' controls, debugging).
//!
//! **Fail closed.** `--require-unreachable HOST:PORT|auto|off` (default `auto`: the API
//! server from `KUBERNETES_SERVICE_HOST`/`_PORT`, none when unset; env
//! `TOOLRUN_REQUIRE_UNREACHABLE`) is checked once at start, in the background
//! ([`reach`]); runs wait for it, and if the target stayed reachable for
//! `--unreachable-wait-ms` (default 5000) every run ends `INFRA_ERROR` naming the cause.
//! After it passed, the agent checks again every `--recheck-interval-ms` (default 1000; 0:
//! never; env `TOOLRUN_RECHECK_INTERVAL_MS`) for as long as it lives: a pod that the policy
//! controller had not programmed yet passes the first check even when no policy selects it.
//! The first connect that succeeds kills the running program (`INFRA_ERROR`) and refuses
//! every later run.
//! `status.isolation` shows the outcome.

pub mod cleanup;
pub mod client;
pub mod files;
pub mod proto;
pub mod reach;
pub mod runs;
pub mod server;
pub mod sysv;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use toolrun_workspace::{Workspace, WorkspaceLimits};

use cleanup::CleanupPlan;
use reach::ReachCheck;

/// The agent's settings (from its command line).
#[derive(Debug, Clone)]
pub struct Config {
    /// The workspace served to file ops.
    pub workspace: Option<PathBuf>,
    /// The workspace's size (`--workspace-limit-bytes`): an emptyDir's `sizeLimit`, which
    /// statvfs of the mount does not show; `usage` reports it (or the filesystem's size when
    /// that is smaller).
    pub workspace_limit_bytes: Option<u64>,
    /// Cleanup between runs.
    pub cleanup: CleanupPlan,
    /// The reachability check, if any.
    pub reach: Option<ReachCheck>,
    /// Longest request line.
    pub max_line_bytes: usize,
    /// Finished results kept.
    pub max_results: usize,
    /// Bytes of finished results kept.
    pub max_result_bytes: u64,
    /// Bytes of events kept per in-flight request for replay.
    pub max_replay_bytes: u64,
    /// Largest `output_limit_bytes` a run may ask.
    pub max_output_bytes: u64,
    /// Bytes queued for stdout before chunk events are dropped.
    pub max_queue_bytes: u64,
    /// Threads serving file ops.
    pub file_workers: usize,
    /// The executable run in one-shot mode for each run.
    pub runner_exe: PathBuf,
}

const USAGE: &str = "usage: toolrun-runner agent [--workspace DIR] [--workspace-limit-bytes N] [--scratch DIR]... \
[--no-cleanup] [--clean-ipc] [--require-unreachable HOST:PORT|auto|off] \
[--unreachable-wait-ms N] [--recheck-interval-ms N] [--connect-timeout-ms N] [--max-line-bytes N] [--max-results N] \
[--max-result-bytes N] [--max-replay-bytes N] [--max-output-bytes N] [--file-workers N]";

impl Config {
    /// Parses the arguments after `agent`; `env` looks up environment variables.
    pub fn parse(args: &[String], env: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let pid1 = std::process::id() == 1;
        let mut cfg = Config {
            workspace: None,
            workspace_limit_bytes: None,
            cleanup: CleanupPlan {
                enabled: true,
                scratch: Vec::new(),
                ipc: pid1,
            },
            reach: None,
            max_line_bytes: 24 << 20,
            max_results: 1024,
            max_result_bytes: 64 << 20,
            max_replay_bytes: 8 << 20,
            max_output_bytes: 16 << 20,
            max_queue_bytes: 64 << 20,
            file_workers: 4,
            // The agent's own executable, for the one-shot runs: /proc/self/exe names it even
            // when its path has been covered or replaced since it started.
            runner_exe: if Path::new("/proc/self/exe").exists() {
                PathBuf::from("/proc/self/exe")
            } else {
                std::env::current_exe()
                    .map_err(|e| format!("cannot find the agent's executable: {e}"))?
            },
        };
        let mut scratch = None::<Vec<PathBuf>>;
        let mut target = env(reach::ENV_TARGET).unwrap_or_else(|| "auto".into());
        let mut wait = match env(reach::ENV_WAIT_MS) {
            Some(v) => Duration::from_millis(number(reach::ENV_WAIT_MS, &v)?),
            None => reach::DEFAULT_WAIT,
        };
        let mut connect_timeout = reach::DEFAULT_CONNECT_TIMEOUT;
        let mut recheck = match env(reach::ENV_RECHECK_MS) {
            Some(v) => Duration::from_millis(number(reach::ENV_RECHECK_MS, &v)?),
            None => reach::DEFAULT_RECHECK,
        };
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
                _ => (arg.as_str(), None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| it.next().cloned())
                    .ok_or(format!("{flag} needs a value; {USAGE}"))
            };
            match flag {
                "--workspace" => cfg.workspace = Some(value()?.into()),
                "--workspace-limit-bytes" => {
                    cfg.workspace_limit_bytes = Some(number(flag, &value()?)?)
                }
                "--scratch" => scratch.get_or_insert_with(Vec::new).push(value()?.into()),
                "--no-cleanup" => cfg.cleanup.enabled = false,
                "--clean-ipc" => cfg.cleanup.ipc = true,
                "--require-unreachable" => target = value()?,
                "--unreachable-wait-ms" => wait = Duration::from_millis(number(flag, &value()?)?),
                "--recheck-interval-ms" => {
                    recheck = Duration::from_millis(number(flag, &value()?)?)
                }
                "--connect-timeout-ms" => {
                    connect_timeout = Duration::from_millis(number(flag, &value()?)?)
                }
                "--max-line-bytes" => cfg.max_line_bytes = number(flag, &value()?)? as usize,
                "--max-results" => cfg.max_results = number(flag, &value()?)? as usize,
                "--max-result-bytes" => cfg.max_result_bytes = number(flag, &value()?)?,
                "--max-replay-bytes" => cfg.max_replay_bytes = number(flag, &value()?)?,
                "--max-output-bytes" => cfg.max_output_bytes = number(flag, &value()?)?,
                "--file-workers" => cfg.file_workers = number(flag, &value()?)? as usize,
                other => return Err(format!("unexpected argument {other:?}; {USAGE}")),
            }
        }
        cfg.cleanup.scratch = scratch.unwrap_or_else(|| {
            if pid1 {
                vec!["/tmp".into(), "/dev/shm".into()]
            } else {
                Vec::new()
            }
        });
        cfg.reach = reach::target_from(&target, &env).map(|target| ReachCheck {
            target,
            wait,
            connect_timeout,
            recheck,
        });
        Ok(cfg)
    }
}

fn number(flag: &str, v: &str) -> Result<u64, String> {
    v.parse()
        .map_err(|_| format!("{flag}: {v:?} is not a non-negative integer"))
}

/// `toolrun-runner agent ...`: serves stdin/stdout until killed. Returns an exit status only
/// on a usage or start-up error.
pub fn main(args: &[String]) -> i32 {
    crate::run::harden_self();
    let cfg = match Config::parse(args, |k| std::env::var(k).ok()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("toolrun-runner agent: {e}");
            return 2;
        }
    };
    let workspace = match &cfg.workspace {
        Some(dir) => match Workspace::open(
            dir,
            WorkspaceLimits {
                size_bytes: cfg.workspace_limit_bytes,
                ..WorkspaceLimits::default()
            },
        ) {
            Ok(ws) => Some(ws),
            Err(e) => {
                eprintln!(
                    "toolrun-runner agent: cannot open the workspace {}: {e}",
                    dir.display()
                );
                return 1;
            }
        },
        None => None,
    };
    // A container runtime may hand over a non-blocking stdin; the reader blocks.
    let stdin = std::io::stdin();
    if let Ok(flags) = nix::fcntl::fcntl(&stdin, nix::fcntl::FcntlArg::F_GETFL) {
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) & !nix::fcntl::OFlag::O_NONBLOCK;
        let _ = nix::fcntl::fcntl(&stdin, nix::fcntl::FcntlArg::F_SETFL(flags));
    }
    let agent = server::Agent::start(cfg, workspace, Box::new(std::io::stdout()));
    let mut input = std::io::BufReader::with_capacity(1 << 20, stdin.lock());
    agent.serve(&mut input, &AtomicBool::new(false));
    0
}
