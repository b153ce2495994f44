//! Running one program: start the interpreter, pump its output, enforce the limits the
//! runner owns, kill everything it started, and write the record.
//!
//! Nothing here knows about the local sandbox: in a Kubernetes pod the runner is the
//! container's entrypoint and this is all there is between the program and the pod log.

use std::io::{PipeReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::resource::{Resource, UsageWho, getrusage, setrlimit};
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::agent::reach::ReachCheck;
use crate::capture::StreamCapture;
use crate::{Event, Language, PROTOCOL_VERSION, RunRecord, RunSpec, Verdict};

/// Largest spec the runner reads (code, stdin and env together).
pub const MAX_SPEC_BYTES: u64 = 64 << 20;
/// Pipe read size: one chunk event carries at most this many bytes of program output.
const READ_BUF: usize = 64 * 1024;
/// After the program ends or is killed: how long to wait for its pipes to close and its
/// descendants to be reaped before giving up and writing the record anyway.
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// While draining, how often to re-send SIGKILL (a fork racing the first kill survives it).
const KILL_INTERVAL: Duration = Duration::from_millis(20);

/// Entry point of the `toolrun-runner` binary; returns the process exit status.
///
/// `toolrun-runner --spec PATH|-`: reads the [`RunSpec`], runs it, writes JSON-lines
/// [`Event`]s to stdout ending with exactly one result record. Exit status 0 means the
/// record was written (whatever the program did). `watch`: the reachability check that
/// passed before, watched while the program runs.
pub fn main_entry(args: impl IntoIterator<Item = String>, watch: Option<Watch>) -> i32 {
    harden_self();
    let mut stdout = std::io::stdout().lock();
    let record = match read_spec(args) {
        Ok(spec) => run(&spec, &mut stdout, watch.as_ref()),
        Err(message) => infra_error(message),
    };
    match stdout
        .write_all(Event::Result(record).to_line().as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// A record for a failure of the runner itself.
pub fn infra_error(message: String) -> RunRecord {
    RunRecord {
        version: PROTOCOL_VERSION,
        verdict: Verdict::InfraError,
        exit_code: -1,
        signal: None,
        stdout: String::new(),
        stderr: String::new(),
        stdout_truncated: false,
        stderr_truncated: false,
        timed_out: false,
        duration_ms: 0,
        message,
        artifacts: None,
    }
}

fn read_spec(args: impl IntoIterator<Item = String>) -> Result<RunSpec, String> {
    let mut args = args.into_iter().skip(1);
    let mut path = None;
    while let Some(arg) = args.next() {
        if arg == "--spec" {
            path = args.next();
        } else if let Some(p) = arg.strip_prefix("--spec=") {
            path = Some(p.to_string());
        } else {
            return Err(format!(
                "unexpected argument {arg:?}; usage: toolrun-runner --spec PATH|-"
            ));
        }
    }
    let path = path.ok_or("usage: toolrun-runner --spec PATH|-")?;
    let mut text = Vec::new();
    let read = if path == "-" {
        std::io::stdin()
            .lock()
            .take(MAX_SPEC_BYTES + 1)
            .read_to_end(&mut text)
    } else {
        std::fs::File::open(&path).and_then(|f| f.take(MAX_SPEC_BYTES + 1).read_to_end(&mut text))
    };
    read.map_err(|e| format!("cannot read spec {path}: {e}"))?;
    if text.len() as u64 > MAX_SPEC_BYTES {
        return Err(format!("spec is larger than {MAX_SPEC_BYTES} bytes"));
    }
    serde_json::from_slice(&text).map_err(|e| format!("invalid spec: {e}"))
}

/// Protections of the runner against the program it starts (same uid); the agent applies
/// them to itself too.
pub fn harden_self() {
    // Not dumpable: the program cannot ptrace the runner nor open /proc/<runner>/fd/1 to
    // write forged events into the record stream.
    let _ = nix::sys::prctl::set_dumpable(false);
    if std::process::id() != 1 {
        // Not PID 1 of a namespace: become the reaper of orphaned descendants so daemons
        // (double fork + setsid) stay within reach of kill_all.
        let _ = nix::sys::prctl::set_child_subreaper(true);
    }
    close_inherited_fds();
}

/// Closes every descriptor above 2 that the runner inherited (its own are all CLOEXEC,
/// so the program gets exactly 0, 1 and 2).
fn close_inherited_fds() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    for fd in fds {
        // The read_dir descriptor itself is already closed: EBADF is expected.
        let _ = nix::unistd::close(fd);
    }
}

/// The isolation watch while the program runs: [`ReachCheck::watch`] in a thread of the
/// runner; the first connect that succeeds kills the program and everything it started, and
/// the record is `INFRA_ERROR` with the watch's message (and the output captured so far).
#[derive(Debug, Clone)]
pub struct Watch {
    /// The check that passed before the program started (off when its `recheck` is zero).
    pub check: ReachCheck,
    /// When the runner started (for the message).
    pub started: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamId {
    Stdout,
    Stderr,
}

enum Msg {
    Chunk(StreamId, String),
    Overflow(StreamId),
    Eof(StreamId),
    /// The program's own process ended; CPU seconds of every reaped descendant so far.
    Exited(WaitStatus, f64),
    /// No process of the run is left (waitpid says ECHILD).
    AllReaped,
    /// The watch found the target reachable: the message naming it.
    Reachable(String),
}

/// The argv that starts `spec.code` with `spec.args`.
pub fn argv(spec: &RunSpec) -> Vec<String> {
    let mut v = vec![spec.interpreter.clone()];
    match spec.language {
        // Everything after `-c CODE` is sys.argv[1:], never an interpreter option.
        Language::Python => v.extend(["-c".into(), spec.code.clone()]),
        // `--` stops node's option parsing: args such as `--version` reach process.argv.
        // "[eval]" stands where a script path would be, so process.argv.slice(2) are the args
        // as in `node script.js args`.
        Language::Javascript => {
            v.extend(["-e".into(), spec.code.clone(), "--".into(), "[eval]".into()])
        }
        // $0 is "bash", the args are $1...
        Language::Bash => v.extend(["-c".into(), spec.code.clone(), "bash".into()]),
        // The program itself: its argv is the interpreter and the args, nothing between.
        Language::Exec => {}
    }
    v.extend(spec.args.iter().cloned());
    v
}

/// Runs `spec`, writing chunk events to `out`, and returns the record (not yet written).
pub fn run(spec: &RunSpec, out: &mut impl Write, watch: Option<&Watch>) -> RunRecord {
    // Setup files and the outputs directory, before any limit is set (see artifacts).
    let before = match crate::artifacts::before_run(&spec.setup) {
        Ok(b) => b,
        Err(message) => return infra_error(message),
    };
    let mut record = match Run::start(spec, watch) {
        Ok(run) => run.finish(spec, out),
        Err(message) => infra_error(message),
    };
    // Every process of the run is gone: nothing races the walk.
    if let Some(a) = &spec.setup.artifacts {
        record.artifacts = Some(crate::artifacts::collect(a, &before));
    }
    record
}

struct Run {
    child: Pid,
    started: Instant,
    rx: Receiver<Msg>,
    /// The memory cgroup's OOM-kill counter and its value before the program started.
    oom: Option<(crate::oom::OomCounter, u64)>,
}

impl Run {
    fn start(spec: &RunSpec, watch: Option<&Watch>) -> Result<Run, String> {
        let cap = spec.limits.output_limit_bytes;
        let (stdin_r, stdin_w) = std::io::pipe().map_err(|e| format!("pipe: {e}"))?;
        let (stdout_r, stdout_w) = std::io::pipe().map_err(|e| format!("pipe: {e}"))?;
        let (stderr_r, stderr_w) = std::io::pipe().map_err(|e| format!("pipe: {e}"))?;
        let (tx, rx) = mpsc::channel();
        let (pid_tx, pid_rx) = mpsc::channel();

        // Every runner thread exists before the limits are set: RLIMIT_NPROC counts threads,
        // and a program that forks up to the limit must not stop the runner's own work.
        spawn_thread("stdout", {
            let tx = tx.clone();
            move || pump(stdout_r, StreamId::Stdout, cap, tx)
        })?;
        spawn_thread("stderr", {
            let tx = tx.clone();
            move || pump(stderr_r, StreamId::Stderr, cap, tx)
        })?;
        // The watch is a thread of the runner, not of the program: started here, before the
        // rlimits and outside the seccomp filter (installed on the calling thread only), it
        // neither loosens them for the program nor is stopped by them (RLIMIT_NPROC counts
        // threads: it exists before). Its one socket at a time fits under RLIMIT_NOFILE: the
        // runner holds fewer descriptors while the program runs (two pipe read ends, stdin's
        // write end) than it needed to start it (every pipe end).
        if let Some(w) = watch.filter(|w| !w.check.recheck.is_zero()) {
            let (w, tx) = (w.clone(), tx.clone());
            spawn_thread("reach", move || {
                if let Some(lost) = w.check.watch(w.started, "the runner") {
                    let _ = tx.send(Msg::Reachable(lost));
                }
            })?;
        }
        spawn_thread("reaper", move || reap(pid_rx, tx))?;
        let stdin_data = spec.stdin.clone().into_bytes();
        spawn_thread("stdin", move || {
            let mut w = stdin_w;
            // EPIPE when the program exits without reading: fine.
            let _ = w.write_all(&stdin_data);
        })?;

        set_limits(spec)?;
        // Fails closed: no filter, no run (INFRA_ERROR).
        crate::seccomp::install()?;

        let argv = argv(spec);
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .env_clear()
            .envs(&spec.env)
            .current_dir(&spec.workdir)
            .stdin(Stdio::from(stdin_r))
            .stdout(Stdio::from(stdout_w))
            .stderr(Stdio::from(stderr_w))
            // Its own process group, so that a runner that is not PID 1 can signal it whole.
            .process_group(0);
        let oom = crate::oom::OomCounter::find().and_then(|c| c.read().map(|n| (c, n)));
        let started = Instant::now();
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", spec.interpreter))?;
        // Drop our copies of the pipe ends so EOF means "every writer is gone".
        drop(cmd);
        let child = Pid::from_raw(child.id() as i32);
        let _ = pid_tx.send(child);
        Ok(Run {
            child,
            started,
            rx,
            oom,
        })
    }

    fn finish(self, spec: &RunSpec, out: &mut impl Write) -> RunRecord {
        let limits = &spec.limits;
        let deadline = self.started + Duration::from_millis(limits.timeout_ms);
        let mut stdout = String::new();
        let mut stderr = String::new();
        let (mut out_eof, mut err_eof, mut all_reaped) = (false, false, false);
        let (mut out_cut, mut err_cut) = (false, false);
        let mut exited: Option<(WaitStatus, f64)> = None;
        let mut duration = None;
        let mut timed_out = false;
        let mut overflow: Option<StreamId> = None;
        let mut reachable: Option<String> = None;
        let mut drain_until: Option<Instant> = None;
        // Every way the run ends: everything the program started is killed, and the pipes
        // and the reaper get a grace that counts from now, not from before the wait (`now`
        // is as old as the wait was long: a program quiet for seconds, then exiting, would
        // otherwise get no grace at all and lose its last output).
        let stop = |drain_until: &mut Option<Instant>| {
            drain_until.get_or_insert_with(|| Instant::now() + DRAIN_GRACE);
            kill_all(self.child);
        };

        loop {
            if exited.is_some() && out_eof && err_eof && all_reaped {
                break;
            }
            let now = Instant::now();
            if drain_until.is_none() && now >= deadline {
                timed_out = true;
                stop(&mut drain_until);
            }
            if let Some(until) = drain_until
                && now >= until
            {
                break;
            }
            let wake = match drain_until {
                Some(until) => until.min(now + KILL_INTERVAL),
                None => deadline,
            };
            match self.rx.recv_timeout(wake.saturating_duration_since(now)) {
                Ok(Msg::Chunk(id, text)) => {
                    let event = match id {
                        StreamId::Stdout => {
                            stdout.push_str(&text);
                            Event::Stdout { data: text }
                        }
                        StreamId::Stderr => {
                            stderr.push_str(&text);
                            Event::Stderr { data: text }
                        }
                    };
                    // The reader may be gone; the record still gets written (or not) below.
                    let _ = out.write_all(event.to_line().as_bytes());
                    let _ = out.flush();
                }
                Ok(Msg::Overflow(id)) => {
                    match id {
                        StreamId::Stdout => out_cut = true,
                        StreamId::Stderr => err_cut = true,
                    }
                    if overflow.is_none() && !timed_out {
                        overflow = Some(id);
                    }
                    stop(&mut drain_until);
                }
                Ok(Msg::Eof(StreamId::Stdout)) => out_eof = true,
                Ok(Msg::Eof(StreamId::Stderr)) => err_eof = true,
                Ok(Msg::Exited(status, cpu)) => {
                    duration.get_or_insert(self.started.elapsed());
                    exited = Some((status, cpu));
                    // Whatever the program left behind (daemons, background jobs) dies now.
                    stop(&mut drain_until);
                }
                Ok(Msg::AllReaped) => all_reaped = true,
                Ok(Msg::Reachable(message)) => {
                    reachable.get_or_insert(message);
                    stop(&mut drain_until);
                }
                Err(RecvTimeoutError::Timeout) => {
                    if drain_until.is_some() {
                        kill_all(self.child);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        let duration = duration.unwrap_or_else(|| self.started.elapsed());

        let (exit_code, signal, cpu) = match exited {
            Some((WaitStatus::Exited(_, code), cpu)) => (code, None, cpu),
            Some((WaitStatus::Signaled(_, sig, _), cpu)) => (128 + sig as i32, Some(sig), cpu),
            _ => (128 + Signal::SIGKILL as i32, Some(Signal::SIGKILL), 0.0),
        };
        let oom_killed = self
            .oom
            .as_ref()
            .is_some_and(|(c, before)| c.read().is_some_and(|now| now > *before));
        let cpu_hit = limits.cpu_seconds > 0
            && (signal == Some(Signal::SIGXCPU)
                || (signal == Some(Signal::SIGKILL) && cpu >= limits.cpu_seconds as f64));
        // First: whatever else happened, the program may have had the network.
        let (verdict, message) = if let Some(message) = reachable {
            (Verdict::InfraError, message)
        } else if timed_out {
            (
                Verdict::Timeout,
                format!("wall-clock time limit of {} ms exceeded", limits.timeout_ms),
            )
        } else if let Some(id) = overflow {
            let name = if id == StreamId::Stdout {
                "stdout"
            } else {
                "stderr"
            };
            (
                Verdict::OutputLimit,
                format!(
                    "{name} exceeded the output limit of {} bytes",
                    limits.output_limit_bytes
                ),
            )
        } else if cpu_hit {
            (
                Verdict::Timeout,
                format!("CPU time limit of {} s exceeded", limits.cpu_seconds),
            )
        } else if exited.is_none() {
            (
                Verdict::InfraError,
                "the program could not be reaped".to_string(),
            )
        } else if exit_code == 0 {
            (Verdict::Ok, String::new())
        } else if oom_killed {
            (
                Verdict::MemoryLimit,
                "killed by the out-of-memory killer: the memory limit was exceeded".to_string(),
            )
        } else if let Some(sig) = signal {
            (Verdict::RuntimeError, format!("killed by signal {sig}"))
        } else {
            (
                Verdict::RuntimeError,
                format!("exited with status {exit_code}"),
            )
        };
        RunRecord {
            version: PROTOCOL_VERSION,
            verdict,
            exit_code,
            signal: signal.map(|s| s as i32),
            stdout,
            stderr,
            stdout_truncated: out_cut,
            stderr_truncated: err_cut,
            timed_out,
            duration_ms: duration.as_millis() as u64,
            message,
            artifacts: None,
        }
    }
}

fn spawn_thread(name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), String> {
    std::thread::Builder::new()
        .name(name.to_string())
        // The threads hold a 64 KiB buffer at most; keep their address space small.
        .stack_size(256 * 1024)
        .spawn(f)
        .map(drop)
        .map_err(|e| format!("cannot start {name} thread: {e}"))
}

/// Sets the rlimits on the runner itself just before it starts the program, which inherits
/// them. The runner's own use is tiny (a few fds, threads that already exist, no files).
fn set_limits(spec: &RunSpec) -> Result<(), String> {
    let l = &spec.limits;
    let set = |r: Resource, soft: u64, hard: u64| {
        setrlimit(r, soft, hard).map_err(|e| format!("setrlimit {r:?}: {e}"))
    };
    // No core files: they would fill /tmp, and a piped core_pattern runs a host helper.
    set(Resource::RLIMIT_CORE, 0, 0)?;
    if l.cpu_seconds > 0 {
        // SIGXCPU at the soft limit, SIGKILL one second later if it is ignored.
        set(Resource::RLIMIT_CPU, l.cpu_seconds, l.cpu_seconds + 1)?;
    }
    if l.max_processes > 0 {
        set(Resource::RLIMIT_NPROC, l.max_processes, l.max_processes)?;
    }
    if l.max_file_bytes > 0 {
        set(Resource::RLIMIT_FSIZE, l.max_file_bytes, l.max_file_bytes)?;
    }
    if l.max_open_files > 0 {
        set(Resource::RLIMIT_NOFILE, l.max_open_files, l.max_open_files)?;
    }
    if l.address_space_bytes > 0 {
        set(
            Resource::RLIMIT_AS,
            l.address_space_bytes,
            l.address_space_bytes,
        )?;
    }
    Ok(())
}

fn pump(mut pipe: PipeReader, id: StreamId, cap: u64, tx: Sender<Msg>) {
    let mut capture = StreamCapture::new(cap);
    let mut buf = vec![0u8; READ_BUF];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                // Past the cap the bytes are read and dropped, so writers never block on a
                // full pipe while they are being killed.
                let pushed = capture.push(&buf[..n]);
                if !pushed.text.is_empty() {
                    let _ = tx.send(Msg::Chunk(id, pushed.text));
                }
                if pushed.overflowed {
                    let _ = tx.send(Msg::Overflow(id));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let tail = capture.finish();
    if !tail.is_empty() {
        let _ = tx.send(Msg::Chunk(id, tail));
    }
    let _ = tx.send(Msg::Eof(id));
}

/// Reaps the program and, as PID 1 or subreaper, every orphan of the run.
fn reap(pid_rx: Receiver<Pid>, tx: Sender<Msg>) {
    let Ok(child) = pid_rx.recv() else { return };
    loop {
        match waitpid(Pid::from_raw(-1), None) {
            Ok(status) => {
                if status.pid() == Some(child) {
                    let cpu = getrusage(UsageWho::RUSAGE_CHILDREN)
                        .map(|u| {
                            let t = u.user_time() + u.system_time();
                            t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6
                        })
                        .unwrap_or(0.0);
                    let _ = tx.send(Msg::Exited(status, cpu));
                }
            }
            Err(Errno::EINTR) => {}
            Err(_) => {
                let _ = tx.send(Msg::AllReaped);
                return;
            }
        }
    }
}

/// SIGKILLs every process the program started.
///
/// As PID 1 of a PID namespace, `kill(-1)` reaches every other process of the namespace,
/// daemons included. Otherwise: the program's process group, then every descendant of the
/// runner (orphans are reparented to it as subreaper).
fn kill_all(child: Pid) {
    if std::process::id() == 1 {
        let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
        return;
    }
    let _ = killpg(child, Signal::SIGKILL);
    for pid in descendants(std::process::id() as i32) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

/// Every live descendant of `root`, from /proc/<pid>/task/<tid>/children.
pub fn descendants(root: i32) -> Vec<i32> {
    let mut found = Vec::new();
    let mut queue = vec![root];
    while let Some(pid) = queue.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let path = task.path().join("children");
            let Ok(text) = std::fs::read_to_string(path) else {
                continue;
            };
            for child in text.split_whitespace().filter_map(|p| p.parse().ok()) {
                if !found.contains(&child) && found.len() < 100_000 {
                    found.push(child);
                    queue.push(child);
                }
            }
        }
    }
    found
}
