//! Shared by the agent tests: the built `toolrun-runner agent` as a child process with pipes,
//! spoken to with the crate's own client codec.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolrun_runner::agent::client::{decode, encode};
use toolrun_runner::agent::proto::{Body, Op, Request, Response};
use toolrun_runner::{Event, Language, RunRecord, RunSpec, RunnerLimits};

pub const RUNNER: &str = env!("CARGO_BIN_EXE_toolrun-runner");
pub const WAIT: Duration = Duration::from_secs(30);

/// A fresh directory under the target's tmp dir (not /tmp: tests may clean scratch dirs).
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "agent-{name}-{}-{:?}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn spec(language: Language, code: &str, workdir: &Path) -> RunSpec {
    RunSpec {
        language,
        code: code.into(),
        args: vec![],
        env: [("PATH".to_string(), "/usr/bin:/bin".to_string())].into(),
        stdin: String::new(),
        interpreter: match language {
            Language::Python => "/usr/bin/python3",
            Language::Javascript => "/usr/bin/node",
            Language::Bash => "/bin/bash",
            Language::Exec => "/bin/cat",
        }
        .into(),
        workdir: workdir.display().to_string(),
        setup: Default::default(),
        limits: RunnerLimits {
            timeout_ms: 10_000,
            output_limit_bytes: 1 << 20,
            cpu_seconds: 0,
            max_processes: 0,
            max_file_bytes: 0,
            max_open_files: 0,
            address_space_bytes: 0,
        },
    }
}

pub fn req(id: &str, op: Op) -> Request {
    Request { id: id.into(), op }
}

pub fn run_req(id: &str, spec: &RunSpec) -> Request {
    req(
        id,
        Op::Run {
            spec: Box::new(spec.clone()),
        },
    )
}

/// The agent process.
pub struct Agent {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    rx: Receiver<Response>,
    /// Received but not yet taken.
    stash: VecDeque<Response>,
}

impl Agent {
    /// `toolrun-runner agent ARGS` (with `--require-unreachable off` unless ARGS set it).
    pub fn spawn(args: &[&str]) -> Agent {
        let mut cmd = Command::new(RUNNER);
        cmd.arg("agent");
        Self::spawn_cmd(cmd, args)
    }

    /// `PREFIX... toolrun-runner agent ARGS` (e.g. under unshare).
    pub fn spawn_cmd(mut cmd: Command, args: &[&str]) -> Agent {
        cmd.args(args);
        if !args.contains(&"--require-unreachable") {
            cmd.args(["--require-unreachable", "off"]);
        }
        // Its own process group, so that Drop also kills an agent started under unshare
        // (PID 1 of a namespace ignores signals from inside it, not from its parent's).
        let mut child = cmd
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let stdin = child.stdin.take();
        let rx = read_responses(stdout);
        Agent {
            child,
            stdin,
            rx,
            stash: VecDeque::new(),
        }
    }

    pub fn send(&mut self, r: &Request) {
        self.send_raw(encode(r));
    }

    pub fn send_raw(&mut self, line: impl AsRef<[u8]>) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_ref()).unwrap();
        stdin.flush().unwrap();
    }

    /// The next response (from the stash first).
    pub fn next(&mut self) -> Response {
        if let Some(r) = self.stash.pop_front() {
            return r;
        }
        self.rx
            .recv_timeout(WAIT)
            .expect("no response from the agent in time")
    }

    /// Every event of `id` up to and including its final one; other responses are kept.
    pub fn collect(&mut self, id: &str) -> Vec<Response> {
        let mut got = Vec::new();
        let mut other = VecDeque::new();
        let deadline = Instant::now() + WAIT;
        // Stashed ones first.
        let mut pending: VecDeque<Response> = std::mem::take(&mut self.stash);
        loop {
            let r = match pending.pop_front() {
                Some(r) => r,
                None => self
                    .rx
                    .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                    .unwrap_or_else(|_| panic!("no final event for {id}; got {got:?}")),
            };
            if r.id.as_deref() == Some(id) {
                let last = r.body.is_final();
                got.push(r);
                if last {
                    other.extend(pending);
                    self.stash = other;
                    return got;
                }
            } else {
                other.push_back(r);
            }
        }
    }

    /// The final event of `id`.
    pub fn final_of(&mut self, id: &str) -> Response {
        self.collect(id).pop().unwrap()
    }

    /// Sends `r` and returns its final event.
    pub fn call(&mut self, r: &Request) -> Response {
        self.send(r);
        self.final_of(&r.id)
    }

    /// Sends a run and returns all its events and its record.
    pub fn run(&mut self, id: &str, spec: &RunSpec) -> (Vec<Response>, RunRecord) {
        self.send(&run_req(id, spec));
        let events = self.collect(id);
        let rec = record(events.last().unwrap());
        (events, rec)
    }

    /// The `ok` output of `status`.
    pub fn status(&mut self, id: &str) -> Value {
        ok(&self.call(&req(id, Op::Status)))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn read_responses(stdout: impl Read + Send + 'static) -> Receiver<Response> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            let r = decode(&line).unwrap_or_else(|e| panic!("undecodable line {line:?}: {e}"));
            if tx.send(r).is_err() {
                return;
            }
        }
    });
    rx
}

pub fn record(r: &Response) -> RunRecord {
    match &r.body {
        Body::Result(rec) => rec.clone(),
        other => panic!("not a result: {other:?}"),
    }
}

pub fn ok(r: &Response) -> Value {
    match &r.body {
        Body::Ok { output } => output.clone(),
        other => panic!("not ok: {other:?}"),
    }
}

/// (code, message) of an error event.
pub fn error(r: &Response) -> (String, String) {
    match &r.body {
        Body::Error(e) => (e.code.as_str(), e.message.clone()),
        other => panic!("not an error: {other:?}"),
    }
}

/// The stdout chunks of a run's events, concatenated.
pub fn streamed_stdout(events: &[Response]) -> String {
    events
        .iter()
        .filter_map(|e| match &e.body {
            Body::Stdout { data } => Some(data.as_str()),
            _ => None,
        })
        .collect()
}

/// The one-shot runner (`--spec -` then `args`, with `env` added) fed `spec` on stdin.
pub fn spawn_one_shot(args: &[&str], env: &[(&str, &str)], spec: &RunSpec) -> Child {
    let mut child = Command::new(RUNNER)
        .args(["--spec", "-"])
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // EPIPE when the runner refused before reading: its record says why.
    let _ = child
        .stdin
        .take()
        .unwrap()
        .write_all(&serde_json::to_vec(spec).unwrap());
    child
}

/// The record a finished one-shot runner wrote last.
pub fn one_shot_record(child: Child) -> RunRecord {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    match Event::parse(text.lines().last().unwrap()).unwrap() {
        Event::Result(r) => r,
        other => panic!("{other:?}"),
    }
}

/// The one-shot runner's record for the same spec.
pub fn one_shot(spec: &RunSpec) -> RunRecord {
    one_shot_record(spawn_one_shot(&[], &[], spec))
}

pub fn file_op(id: &str, kind: toolrun_runner::agent::proto::FileOpKind, args: Value) -> Request {
    req(id, kind.op(args))
}

pub fn j(v: Value) -> Value {
    v
}

pub fn args_path(p: &str) -> Value {
    json!({ "path": p })
}
