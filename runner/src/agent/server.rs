//! The agent's state and request handling: the table of requests by id (in flight with a
//! replay buffer, or finished with their final line), the output queue to stdout, the file-op
//! workers, and the dispatch of each request line.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant};

use serde_json::Value;
use toolrun_workspace::Workspace;

use super::Config;
use super::client::{Line, read_line_bounded};
use super::proto::{
    AckOutput, Body, ErrorBody, ErrorCode, FileOpKind, Isolation, IsolationState, KillOutput,
    MAX_ID_BYTES, Op, Request, Response, ResumeOutput, Status,
};
use crate::RunSpec;

/// Ids remembered after their result was acknowledged or evicted, so that a repeat is refused
/// (`RESULT_EXPIRED`) rather than run again. Past this many, the oldest are forgotten.
pub const MAX_TOMBSTONES: usize = 65_536;
/// How long the reader waits before reading stdin again after an end of file.
const EOF_RETRY: Duration = Duration::from_millis(200);

/// The op names, for telling an unknown op from bad arguments of a known one.
const OPS: &[&str] = &[
    "hello",
    "status",
    "run",
    "kill",
    "resume",
    "ack",
    "read_file",
    "write_file",
    "list_directory",
    "delete_file",
    "move_file",
    "glob",
    "grep",
    "edit",
    "exists",
    "preview_write",
    "preview_edit",
    "resolve_dir",
    "usage",
];

/// A request the agent remembers by id.
enum Entry {
    InFlight(Flight),
    Done {
        fingerprint: u64,
        seq: u64,
        line: Arc<str>,
    },
}

/// What a request in flight is doing.
pub(crate) enum Work {
    /// A run waiting for its turn.
    Queued(Box<RunSpec>),
    /// A run executing; `runner` is the one-shot runner's pid once started.
    Running { runner: Option<i32> },
    /// A file op on a worker.
    File,
}

struct Flight {
    fingerprint: u64,
    next_seq: u64,
    /// The latest events, oldest first, bounded by `Config::max_replay_bytes`.
    buffer: VecDeque<(u64, Arc<str>)>,
    buffered_bytes: u64,
    /// The highest seq dropped from `buffer` (0: none).
    dropped_upto: u64,
    work: Work,
    kill: bool,
}

#[derive(Default)]
struct State {
    table: HashMap<String, Entry>,
    /// Finished ids, oldest first.
    done: VecDeque<String>,
    done_bytes: u64,
    tombstones: HashSet<String>,
    tomb_order: VecDeque<String>,
    runs: VecDeque<String>,
    active_run: Option<String>,
}

/// The agent: shared by the reader, the run worker and the file workers.
pub struct Agent {
    pub(crate) cfg: Config,
    started: Instant,
    pub(crate) workspace: Option<Workspace>,
    out: Output,
    state: Mutex<State>,
    runs_cv: Condvar,
    isolation: Mutex<Isolation>,
    isolation_cv: Condvar,
    served: AtomicU64,
    files_tx: Mutex<mpsc::Sender<(String, FileOpKind, Value)>>,
}

impl Agent {
    /// Starts the agent's threads (output writer, isolation check, run worker, file
    /// workers) around `out`; the caller then feeds request lines with [`Agent::serve`].
    pub fn start(
        cfg: Config,
        workspace: Option<Workspace>,
        out: Box<dyn Write + Send>,
    ) -> Arc<Agent> {
        let (files_tx, files_rx) = mpsc::channel();
        let isolation = Isolation {
            state: if cfg.reach.is_some() {
                IsolationState::Checking
            } else {
                IsolationState::Disabled
            },
            target: cfg.reach.as_ref().map(|r| r.target.clone()),
            message: String::new(),
        };
        let agent = Arc::new(Agent {
            out: Output::new(cfg.max_queue_bytes),
            cfg,
            started: Instant::now(),
            workspace,
            state: Mutex::new(State::default()),
            runs_cv: Condvar::new(),
            isolation: Mutex::new(isolation),
            isolation_cv: Condvar::new(),
            served: AtomicU64::new(0),
            files_tx: Mutex::new(files_tx),
        });
        let a = agent.clone();
        spawn("agent-out", move || a.out.write_loop(out));
        if let Some(check) = agent.cfg.reach.clone() {
            let a = agent.clone();
            spawn("agent-reach", move || {
                let result = check.run();
                let passed = result.is_ok();
                a.set_isolation(match result {
                    Ok(m) => (IsolationState::Isolated, m),
                    Err(m) => (IsolationState::Reachable, m),
                });
                if passed && let Some(lost) = check.watch(a.started, "the agent") {
                    a.set_isolation((IsolationState::Reachable, lost + " and no program is run"));
                }
            });
        }
        let a = agent.clone();
        spawn("agent-runs", move || super::runs::worker(&a));
        let files_rx = Arc::new(Mutex::new(files_rx));
        for i in 0..agent.cfg.file_workers.max(1) {
            let (a, rx) = (agent.clone(), files_rx.clone());
            spawn(&format!("agent-files-{i}"), move || {
                loop {
                    let job = lock(&rx).recv();
                    let Ok((id, kind, args)) = job else { return };
                    let body = match &a.workspace {
                        Some(ws) => match super::files::dispatch(ws, kind, &args) {
                            Ok(output) => Body::Ok { output },
                            Err(e) => Body::Error(e),
                        },
                        None => Body::Error(ErrorBody::new(
                            ErrorCode::NoWorkspace,
                            "this agent serves no workspace (started without --workspace)",
                        )),
                    };
                    a.emit(&id, body);
                }
            });
        }
        agent
    }

    /// Reads request lines from `input` for ever: at end of input it waits and reads again,
    /// so a stdin that a new writer reopens (the FIFO behind a container's stdin when a new
    /// attach comes) is served again. Returns only when `stop` is set (tests).
    pub fn serve(&self, input: &mut impl BufRead, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            match read_line_bounded(input, self.cfg.max_line_bytes) {
                Ok(Line::Line(bytes)) => self.handle_line(&bytes),
                Ok(Line::TooLong) => self.reply_line_error(
                    None,
                    ErrorCode::LineTooLong,
                    format!(
                        "the line is longer than {} bytes; it was not read",
                        self.cfg.max_line_bytes
                    ),
                ),
                // EOF, or a non-blocking stdin with nothing yet: read again later. The runs
                // and every result stay.
                Ok(Line::Eof) | Err(_) => std::thread::sleep(EOF_RETRY),
            }
        }
    }

    fn handle_line(&self, bytes: &[u8]) {
        let value: Value = match serde_json::from_slice(bytes) {
            Ok(v) => v,
            Err(e) => {
                return self.reply_line_error(
                    None,
                    ErrorCode::BadRequest,
                    format!("the line is not JSON: {e}"),
                );
            }
        };
        let id = match value.get("id") {
            Some(Value::String(id)) if !id.is_empty() && id.len() <= MAX_ID_BYTES => id.clone(),
            _ => {
                return self.reply_line_error(
                    None,
                    ErrorCode::BadRequest,
                    format!(
                        "the request has no string \"id\" of 1 to {MAX_ID_BYTES} bytes: every \
                         request is an object with an id and an op"
                    ),
                );
            }
        };
        let op_name = value.get("op").and_then(Value::as_str).map(str::to_string);
        let request: Request = match serde_json::from_value(value) {
            Ok(r) => r,
            Err(e) => {
                let (code, message) = match op_name {
                    None => (
                        ErrorCode::BadRequest,
                        "the request has no string \"op\"".to_string(),
                    ),
                    Some(op) if !OPS.contains(&op.as_str()) => (
                        ErrorCode::UnknownOp,
                        format!("unknown op {op:?}; the ops are {}", OPS.join(", ")),
                    ),
                    Some(op) => (
                        ErrorCode::InvalidArguments,
                        format!("{op}: invalid request: {e}"),
                    ),
                };
                return self.reply_line_error(Some(id), code, message);
            }
        };
        self.handle(request);
    }

    /// Handles one parsed request.
    pub fn handle(&self, req: Request) {
        let Request { id, op } = req;
        match op {
            Op::Hello | Op::Status => {
                let status = self.status();
                self.reply(&id, ok(status));
            }
            Op::Kill { target } => self.kill(&id, &target),
            Op::Resume { target, after_seq } => {
                let st = lock(&self.state);
                self.resume(&st, &id, &target, after_seq);
            }
            Op::Ack { targets } => {
                let mut st = lock(&self.state);
                let mut forgotten = 0;
                for t in targets {
                    if let Some(Entry::Done { line, .. }) = st.table.get(&t) {
                        st.done_bytes -= line.len() as u64;
                        st.table.remove(&t);
                        st.done.retain(|d| d != &t);
                        bury(&mut st, t);
                        forgotten += 1;
                    }
                }
                drop(st);
                self.reply(&id, ok(AckOutput { forgotten }));
            }
            op => self.submit(id, op),
        }
    }

    /// A run or file op: executed at most once per id.
    fn submit(&self, id: String, op: Op) {
        let fingerprint = fingerprint(&op);
        let mut st = lock(&self.state);
        match st.table.get(&id) {
            Some(Entry::InFlight(f)) if f.fingerprint == fingerprint => {
                // A retry of a request in flight: everything buffered, then the live rest.
                self.replay(&st, &id, 0);
                return;
            }
            Some(Entry::Done {
                fingerprint: fp,
                line,
                ..
            }) if *fp == fingerprint => {
                self.out.push(line.clone(), false);
                return;
            }
            Some(_) => {
                drop(st);
                return self.reply_line_error(
                    Some(id.clone()),
                    ErrorCode::IdConflict,
                    format!("the id {id:?} was used before by a different request"),
                );
            }
            None if st.tombstones.contains(&id) => {
                drop(st);
                return self.reply_line_error(
                    Some(id.clone()),
                    ErrorCode::ResultExpired,
                    format!(
                        "the request {id:?} already ran and its result was acknowledged or \
                         evicted; it is not run again"
                    ),
                );
            }
            None => {}
        }
        self.served.fetch_add(1, Ordering::Relaxed);
        let work = match &op {
            Op::Run { spec } => Work::Queued(spec.clone()),
            _ => Work::File,
        };
        st.table.insert(
            id.clone(),
            Entry::InFlight(Flight {
                fingerprint,
                next_seq: 0,
                buffer: VecDeque::new(),
                buffered_bytes: 0,
                dropped_upto: 0,
                work,
                kill: false,
            }),
        );
        match op {
            Op::Run { spec } => {
                if spec.limits.output_limit_bytes > self.cfg.max_output_bytes {
                    let e = ErrorBody::new(
                        ErrorCode::InvalidArguments,
                        format!(
                            "run: limits.output_limit_bytes {} is above this agent's maximum of \
                             {} bytes per stream",
                            spec.limits.output_limit_bytes, self.cfg.max_output_bytes
                        ),
                    );
                    self.emit_locked(&mut st, &id, Body::Error(e));
                    return;
                }
                st.runs.push_back(id);
                self.runs_cv.notify_all();
            }
            op => {
                let (kind, args) = op.file_op().expect("remembered ops are runs or file ops");
                let job = (id, kind, args.clone());
                drop(st);
                let _ = lock(&self.files_tx).send(job);
            }
        }
    }

    fn kill(&self, id: &str, target: &str) {
        let mut st = lock(&self.state);
        let tombstone = st.tombstones.contains(target);
        let state = match st.table.get_mut(target) {
            None if tombstone => "finished",
            None => {
                drop(st);
                return self.reply_line_error(
                    Some(id.to_string()),
                    ErrorCode::UnknownTarget,
                    format!("kill: no request {target:?}"),
                );
            }
            Some(Entry::Done { .. }) => "finished",
            Some(Entry::InFlight(f)) => match f.work {
                Work::File => "file_op",
                Work::Queued(_) => {
                    f.kill = true;
                    "queued"
                }
                Work::Running { runner } => {
                    f.kill = true;
                    if let Some(pid) = runner {
                        super::runs::kill_program(pid);
                    }
                    "running"
                }
            },
        };
        if state == "queued" {
            st.runs.retain(|r| r != target);
            let mut rec =
                crate::run::infra_error("cancelled by a kill request before it started".into());
            rec.verdict = crate::Verdict::Cancelled;
            self.emit_locked(&mut st, target, Body::Result(rec));
        }
        drop(st);
        self.reply(
            id,
            ok(KillOutput {
                state: state.into(),
            }),
        );
    }

    fn resume(&self, st: &State, id: &str, target: &str, after_seq: u64) {
        let (state, replayed) = match st.table.get(target) {
            Some(Entry::Done { seq, line, .. }) => {
                let again = *seq > after_seq;
                if again {
                    self.out.push(line.clone(), false);
                }
                ("finished", u64::from(again))
            }
            Some(Entry::InFlight(f)) => {
                let state = match f.work {
                    Work::Queued(_) => "queued",
                    _ => "running",
                };
                (state, self.replay(st, target, after_seq))
            }
            None => {
                let (code, msg) = if st.tombstones.contains(target) {
                    (
                        ErrorCode::ResultExpired,
                        format!("resume: the result of {target:?} was acknowledged or evicted"),
                    )
                } else {
                    (
                        ErrorCode::UnknownTarget,
                        format!("resume: no request {target:?}"),
                    )
                };
                let line = line_of(&Response {
                    id: Some(id.to_string()),
                    seq: 1,
                    body: Body::Error(ErrorBody::new(code, msg)),
                });
                self.out.push(line, false);
                return;
            }
        };
        let line = line_of(&Response {
            id: Some(id.to_string()),
            seq: 1,
            body: ok(ResumeOutput {
                state: state.into(),
                replayed,
            }),
        });
        self.out.push(line, false);
    }

    /// Re-sends the buffered events of in-flight `id` after `after_seq` (a `lost` event
    /// first when some were dropped); the caller holds the state lock, so live events follow
    /// in order.
    fn replay(&self, st: &State, id: &str, after_seq: u64) -> u64 {
        let Some(Entry::InFlight(f)) = st.table.get(id) else {
            return 0;
        };
        let mut n = 0;
        if f.dropped_upto > after_seq {
            let lost = Response {
                id: Some(id.to_string()),
                seq: f.dropped_upto,
                body: Body::Lost {
                    first_seq: after_seq + 1,
                    last_seq: f.dropped_upto,
                },
            };
            self.out.push(line_of(&lost), false);
            n += 1;
        }
        for (seq, line) in &f.buffer {
            if *seq > after_seq {
                self.out.push(line.clone(), true);
                n += 1;
            }
        }
        n
    }

    /// Emits the next event of request `id` (buffered for replay; a final event replaces
    /// the request's entry with its stored line).
    pub(crate) fn emit(&self, id: &str, body: Body) {
        let mut st = lock(&self.state);
        self.emit_locked(&mut st, id, body);
    }

    fn emit_locked(&self, st: &mut State, id: &str, body: Body) {
        let Some(Entry::InFlight(f)) = st.table.get_mut(id) else {
            return;
        };
        f.next_seq += 1;
        let seq = f.next_seq;
        let is_final = body.is_final();
        let line = line_of(&Response {
            id: Some(id.to_string()),
            seq,
            body,
        });
        self.out.push(line.clone(), !is_final);
        if !is_final {
            f.buffered_bytes += line.len() as u64;
            f.buffer.push_back((seq, line));
            while f.buffered_bytes > self.cfg.max_replay_bytes {
                let Some((s, l)) = f.buffer.pop_front() else {
                    break;
                };
                f.buffered_bytes -= l.len() as u64;
                f.dropped_upto = s;
            }
            return;
        }
        let fingerprint = f.fingerprint;
        st.done_bytes += line.len() as u64;
        st.table.insert(
            id.to_string(),
            Entry::Done {
                fingerprint,
                seq,
                line,
            },
        );
        st.done.push_back(id.to_string());
        // Bounded by count and bytes; the newest result is always kept.
        while st.done.len() > 1
            && (st.done.len() > self.cfg.max_results || st.done_bytes > self.cfg.max_result_bytes)
        {
            let old = st.done.pop_front().expect("len > 1");
            if let Some(Entry::Done { line, .. }) = st.table.remove(&old) {
                st.done_bytes -= line.len() as u64;
            }
            bury(st, old);
        }
    }

    /// A response that is not part of any request's stored events (control ops).
    fn reply(&self, id: &str, body: Body) {
        let line = line_of(&Response {
            id: Some(id.to_string()),
            seq: 1,
            body,
        });
        self.out.push(line, false);
    }

    /// An error about a line itself (seq 0: not an event of any request).
    fn reply_line_error(&self, id: Option<String>, code: ErrorCode, message: String) {
        let line = line_of(&Response {
            id,
            seq: 0,
            body: Body::Error(ErrorBody::new(code, message)),
        });
        self.out.push(line, false);
    }

    /// The agent's status.
    pub fn status(&self) -> Status {
        let st = lock(&self.state);
        Status {
            agent_version: env!("CARGO_PKG_VERSION").into(),
            protocol_version: super::proto::AGENT_PROTOCOL_VERSION,
            record_version: crate::PROTOCOL_VERSION,
            uptime_ms: self.started.elapsed().as_millis() as u64,
            requests_served: self.served.load(Ordering::Relaxed),
            run_active: st.active_run.is_some(),
            active_run: st.active_run.clone(),
            runs_queued: st.runs.len(),
            workspace: self.cfg.workspace.as_ref().map(|p| p.display().to_string()),
            pid1: std::process::id() == 1,
            isolation: lock(&self.isolation).clone(),
            results_held: st.done.len(),
            results_bytes: st.done_bytes,
            lines_dropped: self.out.dropped.load(Ordering::Relaxed),
        }
    }

    // ---- for the run worker ------------------------------------------------------------

    /// Waits for the next queued run; marks it active and returns its id and spec.
    pub(crate) fn next_run(&self) -> (String, RunSpec) {
        let mut st = lock(&self.state);
        loop {
            while let Some(id) = st.runs.pop_front() {
                if let Some(Entry::InFlight(f)) = st.table.get_mut(&id)
                    && let Work::Queued(_) = f.work
                {
                    let Work::Queued(spec) =
                        std::mem::replace(&mut f.work, Work::Running { runner: None })
                    else {
                        unreachable!("matched above")
                    };
                    st.active_run = Some(id.clone());
                    return (id, *spec);
                }
            }
            st = self
                .runs_cv
                .wait(st)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// Records the runner's pid; returns whether a kill was asked already.
    pub(crate) fn set_runner(&self, id: &str, pid: Option<i32>) -> bool {
        let mut st = lock(&self.state);
        match st.table.get_mut(id) {
            Some(Entry::InFlight(f)) => {
                f.work = Work::Running { runner: pid };
                f.kill
            }
            _ => false,
        }
    }

    /// A kill was asked for run `id`.
    pub(crate) fn kill_requested(&self, id: &str) -> bool {
        matches!(lock(&self.state).table.get(id), Some(Entry::InFlight(f)) if f.kill)
    }

    /// The run is over (its final event was emitted).
    pub(crate) fn run_ended(&self) {
        lock(&self.state).active_run = None;
    }

    fn set_isolation(&self, (state, message): (IsolationState, String)) {
        let mut iso = lock(&self.isolation);
        (iso.state, iso.message) = (state, message);
        self.isolation_cv.notify_all();
    }

    /// The message naming the cause once the pod was found not isolated (at the first check
    /// or by the watch after it): the running program is killed, later runs refused.
    pub(crate) fn isolation_lost(&self) -> Option<String> {
        let iso = lock(&self.isolation);
        (iso.state == IsolationState::Reachable).then(|| iso.message.clone())
    }

    /// Waits for the reachability check: `Err` with its message when runs are refused.
    pub(crate) fn wait_isolation(&self) -> Result<(), String> {
        let mut iso = lock(&self.isolation);
        while iso.state == IsolationState::Checking {
            iso = self
                .isolation_cv
                .wait(iso)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        match iso.state {
            IsolationState::Reachable => Err(iso.message.clone()),
            _ => Ok(()),
        }
    }
}

fn ok<T: serde::Serialize>(output: T) -> Body {
    Body::Ok {
        output: serde_json::to_value(output).expect("outputs serialise"),
    }
}

fn bury(st: &mut State, id: String) {
    if st.tombstones.insert(id.clone()) {
        st.tomb_order.push_back(id);
    }
    while st.tomb_order.len() > MAX_TOMBSTONES {
        if let Some(old) = st.tomb_order.pop_front() {
            st.tombstones.remove(&old);
        }
    }
}

/// Identifies a request's content, so that a repeated id with other content is refused.
fn fingerprint(op: &Op) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    // serde_json's maps are sorted: equal requests serialise equally.
    serde_json::to_string(op).unwrap_or_default().hash(&mut h);
    h.finish()
}

fn line_of(r: &Response) -> Arc<str> {
    let mut s = serde_json::to_string(r).expect("responses serialise");
    s.push('\n');
    s.into()
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .expect("the agent cannot start its threads");
}

/// The queue of lines to stdout, written by one thread so that a slow or absent reader never
/// blocks a run's relay (which must keep draining the runner, whose timeouts depend on it).
struct Output {
    q: Mutex<OutQ>,
    cv: Condvar,
    max_bytes: u64,
    dropped: AtomicU64,
}

#[derive(Default)]
struct OutQ {
    lines: VecDeque<Arc<str>>,
    bytes: u64,
}

impl Output {
    fn new(max_bytes: u64) -> Self {
        Self {
            q: Mutex::new(OutQ::default()),
            cv: Condvar::new(),
            max_bytes,
            dropped: AtomicU64::new(0),
        }
    }

    /// Queues a line. A `droppable` one (a chunk, which stays in the replay buffer and in the
    /// final record) is dropped when the queue is full; final events never are (their number
    /// is bounded by the results table).
    fn push(&self, line: Arc<str>, droppable: bool) {
        let mut q = lock(&self.q);
        if droppable && q.bytes + line.len() as u64 > self.max_bytes {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        q.bytes += line.len() as u64;
        q.lines.push_back(line);
        self.cv.notify_one();
    }

    fn write_loop(&self, mut out: Box<dyn Write + Send>) {
        loop {
            let (line, more) = {
                let mut q = lock(&self.q);
                while q.lines.is_empty() {
                    q = self
                        .cv
                        .wait(q)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
                let line = q.lines.pop_front().expect("not empty");
                q.bytes -= line.len() as u64;
                (line, !q.lines.is_empty())
            };
            // EPIPE (no reader attached) or any other error: the line is lost for this
            // reader; the request's events stay in the agent for a `resume`.
            let written = out
                .write_all(line.as_bytes())
                .and_then(|()| if more { Ok(()) } else { out.flush() });
            if written.is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
