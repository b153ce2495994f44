//! The run worker: one program at a time, each run by the one-shot runner itself.
//!
//! The agent starts its own executable in one-shot mode (`toolrun-runner --spec -`) for each
//! run and relays its events, so capture, limits, seccomp, kill-everything and the verdicts
//! are the one-shot runner's code, not a second copy, and the limits it sets on itself (rlimits,
//! seccomp) bind the program without binding the long-lived agent. The agent only adds:
//! the cleanup between runs ([`super::cleanup`]), `kill` (the program is SIGKILLed and the
//! record's verdict becomes `CANCELLED`), a pod found not isolated while a program runs (it
//! is killed: `INFRA_ERROR` naming the cause), and a runner that dies without a record (the
//! program may kill it: same uid) ending as `INFRA_ERROR` with the output relayed so far.

use std::io::{BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::client::{Line, read_line_bounded};
use super::proto::Body;
use super::server::Agent;
use crate::run::infra_error;
use crate::{Event, RunRecord, RunSpec, Verdict};

/// Beyond the run's own timeout, how long the agent waits for the runner's record before it
/// kills the runner (the runner enforces the timeout; this only covers a runner that hangs).
const RUNNER_GRACE: Duration = Duration::from_secs(30);
/// While a kill is pending, how often the program's processes are SIGKILLed again (a fork
/// racing the kill, or a program the runner had not started yet).
const KILL_TICK: Duration = Duration::from_millis(20);

/// Runs the queued runs, one at a time, for ever.
pub fn worker(agent: &Agent) {
    loop {
        let (id, spec) = agent.next_run();
        let record = execute(agent, &id, &spec);
        agent.emit(&id, Body::Result(record));
        agent.run_ended();
    }
}

fn cancelled(message: &str) -> RunRecord {
    let mut rec = infra_error(message.into());
    rec.verdict = Verdict::Cancelled;
    rec
}

fn execute(agent: &Agent, id: &str, spec: &RunSpec) -> RunRecord {
    if let Err(message) = agent.wait_isolation() {
        return infra_error(message);
    }
    if agent.kill_requested(id) {
        return cancelled("cancelled by a kill request before it started");
    }
    if let Err(message) = agent.cfg.cleanup.before_run() {
        return infra_error(message);
    }
    let mut record = relay(agent, id, spec);
    if let Err(message) = agent.cfg.cleanup.after_run() {
        record.message = format!("{} (after the run: {message})", record.message);
    }
    if agent.kill_requested(id) && record.verdict != Verdict::Ok {
        record.verdict = Verdict::Cancelled;
        record.message = "cancelled by a kill request".into();
    }
    record
}

/// Starts the one-shot runner on `spec` and relays its events as events of request `id`.
fn relay(agent: &Agent, id: &str, spec: &RunSpec) -> RunRecord {
    let spec_json = match serde_json::to_vec(spec) {
        Ok(j) => j,
        Err(e) => return infra_error(format!("cannot encode the spec: {e}")),
    };
    // A clean environment: the runner needs none, and the program's is exactly spec.env.
    // (So the runner never repeats the agent's reachability check either.)
    let child = Command::new(&agent.cfg.runner_exe)
        .args(["--spec", "-"])
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            return infra_error(format!(
                "cannot start the runner {}: {e}",
                agent.cfg.runner_exe.display()
            ));
        }
    };
    let runner = child.id() as i32;
    if agent.set_runner(id, Some(runner)) {
        kill_program(runner);
    }
    let mut stdin = child.stdin.take().expect("piped");
    std::thread::spawn(move || {
        // EPIPE when the runner died early: its record (or its absence) says why.
        let _ = stdin.write_all(&spec_json);
    });
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    // A record holds both streams, each at most the cap, JSON-escaped (up to 6 bytes per
    // byte for control characters).
    let max_line = (spec.limits.output_limit_bytes as usize)
        .saturating_mul(12)
        .saturating_add(64 * 1024);
    std::thread::spawn(move || {
        let mut r = BufReader::with_capacity(64 * 1024, stdout);
        loop {
            let line = read_line_bounded(&mut r, max_line);
            let end = !matches!(line, Ok(Line::Line(_)));
            if tx.send(line).is_err() || end {
                return;
            }
        }
    });

    let deadline = Instant::now() + Duration::from_millis(spec.limits.timeout_ms) + RUNNER_GRACE;
    let (mut out, mut err) = (String::new(), String::new());
    let mut record = None;
    let mut problem = None;
    loop {
        if let Some(message) = agent.isolation_lost() {
            problem = Some(message);
            break;
        }
        let killing = agent.kill_requested(id);
        if killing {
            kill_program(runner);
        }
        if Instant::now() >= deadline {
            problem = Some(format!(
                "the runner wrote no record within {} ms after the run's timeout; it was killed",
                RUNNER_GRACE.as_millis()
            ));
            break;
        }
        let wait = if killing {
            KILL_TICK
        } else {
            Duration::from_millis(200)
        };
        match rx.recv_timeout(wait) {
            Ok(Ok(Line::Line(bytes))) => match std::str::from_utf8(&bytes).ok().map(Event::parse) {
                Some(Ok(Event::Stdout { data })) => {
                    out.push_str(&data);
                    agent.emit(id, Body::Stdout { data });
                }
                Some(Ok(Event::Stderr { data })) => {
                    err.push_str(&data);
                    agent.emit(id, Body::Stderr { data });
                }
                Some(Ok(Event::Result(r))) => record = Some(r),
                _ => {
                    problem = Some("the runner wrote a line that is not an event".into());
                    break;
                }
            },
            Ok(Ok(Line::TooLong)) => {
                problem = Some(format!(
                    "the runner wrote a line longer than {max_line} bytes"
                ));
                break;
            }
            Ok(Ok(Line::Eof)) | Ok(Err(_)) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
    if problem.is_some() {
        let _ = kill(Pid::from_raw(runner), Signal::SIGKILL);
        kill_program(runner);
    }
    let status = wait_runner(&mut child);
    match (record, problem) {
        (Some(r), None) => r,
        (_, problem) => {
            let why =
                problem.unwrap_or_else(|| format!("the runner ended without a record ({status})"));
            let mut r = infra_error(why);
            r.stdout = out;
            r.stderr = err;
            r
        }
    }
}

/// Reaps the runner (bounded: it exits right after its record; else it is killed).
fn wait_runner(child: &mut std::process::Child) -> String {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status.to_string(),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                return child
                    .wait()
                    .map_or_else(|e| e.to_string(), |s| s.to_string());
            }
            Err(e) => return e.to_string(),
        }
    }
}

/// SIGKILLs every process the runner `runner` started (the program and its descendants; the
/// runner is their subreaper), not the runner, which then writes the record.
pub fn kill_program(runner: i32) {
    for pid in crate::run::descendants(runner) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}
