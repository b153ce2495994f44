//! The operator's side of the in-pod agent (`toolrun-runner agent`, PID 1 of a session or
//! warm pod): JSON-lines requests over a `pods/attach` stream, through the Kubernetes API
//! only. The pod keeps its deny-all NetworkPolicy and has no service-account token; only the
//! operator holds `pods/attach`, in the sandbox namespace.
//!
//! A [`Connection`] is one stream to one agent, shared by every caller: requests are written
//! whole under one lock (two attaches to one pod's stdin could interleave their lines, so
//! there is one per pod: [`Pool`]), and one reader task hands each response to the call
//! waiting for its id. Many calls (file ops beside a run) are in flight at once.
//!
//! A dropped stream is reattached and every request in flight is sent again: the agent
//! executes an id at most once and answers a repeat with what it has (the buffered events
//! then the live ones, or the stored final event), and [`Tracker`] drops duplicates and
//! orders what arrives (asking `resume {target, after_seq}` to fill a gap), so nothing is
//! lost or seen twice. When the pod is gone or the agent cannot be reattached within the
//! retry budget, the call ends with a typed [`RelayError`], never a hang.
//!
//! [`Connection::over`] runs the same client over any byte streams (the tests drive a real
//! local agent process through its pipes); [`Agent`] is the single-caller form.

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::AttachParams;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use toolrun_runner::agent::client::{Tracker, decode, encode};
use toolrun_runner::agent::proto::{Body, Op, Request, Response};

/// Longest response line read from the agent (a run's record with its output and artifacts
/// fits well within it).
pub const MAX_LINE_BYTES: u64 = 64 << 20;

/// Reattach attempts per call by default, with a doubling pause from 100 ms.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 6;

/// Longest a request line may take to be written before the stream counts as broken.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a request could not be completed.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// Attaching failed (the pod is gone, not running, or the API server refused).
    #[error("attaching to pod {pod}: {source}")]
    Attach {
        /// The pod.
        pod: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// The stream broke and could not be reattached within the retry budget.
    #[error("the agent in pod {pod} is unreachable after {attempts} attempts: {last}")]
    Unreachable {
        /// The pod.
        pod: String,
        /// Reattach attempts made.
        attempts: u32,
        /// The last failure.
        last: String,
    },
    /// The agent wrote something that is not a response line, or the client misused the
    /// connection (the same id twice at once).
    #[error("the agent in pod {pod} wrote a bad line: {why}")]
    Protocol {
        /// The pod.
        pod: String,
        /// What was wrong.
        why: String,
    },
}

/// The two halves of one stream to an agent.
pub struct Streams {
    /// The agent's stdin.
    pub stdin: Box<dyn AsyncWrite + Unpin + Send>,
    /// The agent's stdout.
    pub stdout: Box<dyn AsyncRead + Unpin + Send>,
    /// Kept alive as long as the stream is used (e.g. kube's `AttachedProcess`).
    pub keep: Option<Box<dyn Any + Send>>,
}

type OpenFuture = Pin<Box<dyn Future<Output = Result<Streams, RelayError>> + Send>>;

/// Opens (or reopens) a stream to the agent.
pub type Opener = Arc<dyn Fn() -> OpenFuture + Send + Sync>;

/// One stream to one agent, shared by concurrent calls; cheap to clone.
#[derive(Clone)]
pub struct Connection {
    shared: Arc<Shared>,
}

struct Shared {
    pod: String,
    opener: Opener,
    link: tokio::sync::Mutex<Link>,
    routes: Mutex<Routes>,
    next_id: AtomicU64,
}

#[derive(Default)]
struct Link {
    stdin: Option<Box<dyn AsyncWrite + Unpin + Send>>,
    /// Counts the streams opened; each reader knows its own.
    generation: u64,
    reader: Option<tokio::task::JoinHandle<()>>,
    keep: Option<Box<dyn Any + Send>>,
}

#[derive(Default)]
struct Routes {
    tracker: Tracker,
    waiters: HashMap<String, mpsc::UnboundedSender<Msg>>,
}

enum Msg {
    Event(Response),
    /// The stream of this generation broke: what was sent on it must be sent again.
    Broken {
        generation: u64,
        why: String,
    },
}

/// Removes a call's route when the call ends or is dropped.
struct Route {
    shared: Arc<Shared>,
    id: String,
}

impl Drop for Route {
    fn drop(&mut self) {
        let mut routes = self.shared.routes();
        routes.waiters.remove(&self.id);
        routes.tracker.forget(&self.id);
    }
}

impl Shared {
    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the current stream broken (if it is still `generation`) and tells every
    /// waiting call.
    fn break_link(&self, link: &mut Link, generation: u64, why: &str) {
        if link.generation != generation || link.stdin.is_none() {
            return;
        }
        link.stdin = None;
        link.keep = None;
        if let Some(reader) = link.reader.take() {
            reader.abort();
        }
        for tx in self.routes().waiters.values() {
            let _ = tx.send(Msg::Broken {
                generation,
                why: why.to_string(),
            });
        }
    }
}

impl Connection {
    /// A connection that opens its stream with `opener`, at the first call (or
    /// [`Connection::connect`]) and again whenever it breaks.
    pub fn lazy(pod: &str, opener: Opener) -> Connection {
        Connection {
            shared: Arc::new(Shared {
                pod: pod.to_string(),
                opener,
                link: tokio::sync::Mutex::new(Link::default()),
                routes: Mutex::new(Routes::default()),
                next_id: AtomicU64::new(0),
            }),
        }
    }

    /// A connection over given streams (a local agent's pipes), which cannot be reopened:
    /// once they break, calls end [`RelayError::Unreachable`].
    pub fn over(
        name: &str,
        stdin: impl AsyncWrite + Unpin + Send + 'static,
        stdout: impl AsyncRead + Unpin + Send + 'static,
    ) -> Connection {
        let once = Arc::new(Mutex::new(Some(Streams {
            stdin: Box::new(stdin),
            stdout: Box::new(stdout),
            keep: None,
        })));
        let pod = name.to_string();
        Connection::lazy(
            name,
            Arc::new(move || {
                let streams = once.lock().unwrap_or_else(|e| e.into_inner()).take();
                let pod = pod.clone();
                Box::pin(async move {
                    streams.ok_or_else(|| RelayError::Unreachable {
                        pod,
                        attempts: 1,
                        last: "the stream ended and cannot be reopened".into(),
                    })
                })
            }),
        )
    }

    /// A connection to `container` of `pod` over `pods/attach` (the container must run the
    /// agent with `stdin: true` and `stdinOnce: false`); attaches at the first call.
    pub fn attach_lazy(pods: Api<Pod>, pod: &str, container: &str) -> Connection {
        let (name, container) = (pod.to_string(), container.to_string());
        Connection::lazy(
            pod,
            Arc::new(move || {
                let (pods, pod, container) = (pods.clone(), name.clone(), container.clone());
                Box::pin(async move { open_attach(&pods, &pod, &container).await })
            }),
        )
    }

    /// The pod (or name) this connection reaches.
    pub fn pod(&self) -> &str {
        &self.shared.pod
    }

    /// A request id unique within this process (`prefix` names its purpose).
    pub fn new_id(&self, prefix: &str) -> String {
        let n = self.shared.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        format!("{prefix}-{}-{n}", std::process::id())
    }

    /// Opens the stream now if it is not open (errors as the opener reports them).
    pub async fn connect(&self) -> Result<(), RelayError> {
        let mut link = self.shared.link.lock().await;
        if link.stdin.is_none() {
            self.install(&mut link, (self.shared.opener)().await?);
        }
        Ok(())
    }

    /// The stream is open (it may still turn out broken at the next write or read).
    pub fn is_open(&self) -> bool {
        self.shared
            .link
            .try_lock()
            .map(|l| l.stdin.is_some())
            .unwrap_or(true)
    }

    /// Calls waiting for answers now.
    pub fn calls_in_flight(&self) -> usize {
        self.shared.routes().waiters.len()
    }

    /// Drops the stream as a network failure would (tests of reconnection); calls in flight
    /// send their requests again on the next stream.
    pub async fn drop_stream(&self) {
        let mut link = self.shared.link.lock().await;
        let generation = link.generation;
        self.shared
            .break_link(&mut link, generation, "the stream was dropped");
    }

    fn install(&self, link: &mut Link, streams: Streams) {
        link.generation += 1;
        link.stdin = Some(streams.stdin);
        link.keep = streams.keep;
        let generation = link.generation;
        let shared = Arc::downgrade(&self.shared);
        let mut stdout = BufReader::new(streams.stdout);
        link.reader = Some(tokio::spawn(async move {
            let why = loop {
                let mut line = Vec::new();
                let read = (&mut stdout)
                    .take(MAX_LINE_BYTES + 1)
                    .read_until(b'\n', &mut line)
                    .await;
                match read {
                    Ok(0) => break "the stream ended".to_string(),
                    Err(e) => break format!("reading: {e}"),
                    Ok(_) => {}
                }
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                if line.len() as u64 > MAX_LINE_BYTES {
                    // The rest of that line follows; it will not decode either.
                    tracing::warn!(pod = %shared.pod, "the agent wrote a line longer than {MAX_LINE_BYTES} bytes; skipped");
                    continue;
                }
                let text = String::from_utf8_lossy(&line);
                let response = match decode(&text) {
                    Ok(r) => r,
                    Err(e) => {
                        // A line cut when an earlier reader detached may reach us: skip it.
                        tracing::debug!(pod = %shared.pod, error = %e, "skipping a line that is not a response");
                        continue;
                    }
                };
                let mut routes = shared.routes();
                let Some(id) = response.id.clone() else {
                    continue;
                };
                if !routes.waiters.contains_key(&id) {
                    // Answers to resumes and acks, and to calls that gave up.
                    continue;
                }
                for r in routes.tracker.push(response) {
                    if let Some(tx) = r.id.as_ref().and_then(|id| routes.waiters.get(id)) {
                        let _ = tx.send(Msg::Event(r));
                    }
                }
            };
            if let Some(shared) = shared.upgrade() {
                let mut link = shared.link.lock().await;
                // Not aborted by break_link from here on: we are the reader being ended.
                if link.generation == generation {
                    link.reader = None;
                }
                shared.break_link(&mut link, generation, &why);
            }
        }));
    }

    /// Writes one line, opening the stream first if needed; returns the stream's
    /// generation it was written on.
    async fn send(
        &self,
        line: &str,
        failures: &mut u32,
        last: &mut String,
        max_attempts: u32,
    ) -> Result<u64, RelayError> {
        loop {
            let mut link = self.shared.link.lock().await;
            if link.stdin.is_none() {
                if *failures >= max_attempts {
                    return Err(RelayError::Unreachable {
                        pod: self.shared.pod.clone(),
                        attempts: *failures,
                        last: last.clone(),
                    });
                }
                if *failures > 0 {
                    tokio::time::sleep(Duration::from_millis(100 << (*failures - 1).min(6))).await;
                }
                match (self.shared.opener)().await {
                    Ok(streams) => self.install(&mut link, streams),
                    Err(e) => {
                        *failures += 1;
                        *last = e.to_string();
                        continue;
                    }
                }
            }
            let generation = link.generation;
            let stdin = link.stdin.as_mut().expect("opened above");
            let written = tokio::time::timeout(WRITE_TIMEOUT, async {
                stdin.write_all(line.as_bytes()).await?;
                stdin.flush().await
            })
            .await;
            match written {
                Ok(Ok(())) => return Ok(generation),
                Ok(Err(e)) => {
                    *failures += 1;
                    *last = format!("writing: {e}");
                }
                Err(_) => {
                    *failures += 1;
                    *last = format!("writing took longer than {WRITE_TIMEOUT:?}");
                }
            }
            let why = last.clone();
            self.shared.break_link(&mut link, generation, &why);
        }
    }

    /// Sends `request` and returns its final event; `on_event` sees each event before it
    /// (stdout/stderr chunks, `lost`), in order and exactly once, across reattachments.
    /// Other calls may be in flight on the same connection; each id at most once at a time.
    pub async fn call(
        &self,
        request: Request,
        on_event: impl FnMut(&Response),
    ) -> Result<Response, RelayError> {
        self.call_with(request, on_event, DEFAULT_MAX_ATTEMPTS)
            .await
    }

    /// [`Connection::call`] with a reattach budget of `max_attempts` failures.
    pub async fn call_with(
        &self,
        request: Request,
        mut on_event: impl FnMut(&Response),
        max_attempts: u32,
    ) -> Result<Response, RelayError> {
        let id = request.id.clone();
        let (tx, mut rx) = mpsc::unbounded_channel();
        {
            let mut routes = self.shared.routes();
            if routes.waiters.contains_key(&id) {
                return Err(RelayError::Protocol {
                    pod: self.shared.pod.clone(),
                    why: format!("request {id:?} is already in flight on this connection"),
                });
            }
            routes.waiters.insert(id.clone(), tx);
        }
        let _route = Route {
            shared: self.shared.clone(),
            id: id.clone(),
        };
        let line = encode(&request);
        let mut failures = 0u32;
        let mut last = String::new();
        let mut sent_on = self
            .send(&line, &mut failures, &mut last, max_attempts)
            .await?;
        loop {
            let msg = rx.recv().await.ok_or_else(|| RelayError::Protocol {
                pod: self.shared.pod.clone(),
                why: "the call's route was removed".into(),
            })?;
            match msg {
                Msg::Event(r) => {
                    if r.body.is_final() {
                        return Ok(r);
                    }
                    on_event(&r);
                    let after_seq = {
                        let routes = self.shared.routes();
                        routes
                            .tracker
                            .waiting(&id)
                            .then(|| routes.tracker.last_seq(&id))
                    };
                    if let Some(after_seq) = after_seq {
                        let resume = Request {
                            id: self.new_id("resume"),
                            op: Op::Resume {
                                target: id.clone(),
                                after_seq,
                            },
                        };
                        sent_on = self
                            .send(&encode(&resume), &mut failures, &mut last, max_attempts)
                            .await?;
                    }
                }
                Msg::Broken { generation, why } if generation >= sent_on => {
                    // The request may or may not have reached the agent: send it again. An
                    // id is executed at most once: a repeat in flight replays its buffered
                    // events from seq 1, then the live ones; a finished one its stored final
                    // event. The tracker drops what we already have.
                    failures += 1;
                    last = why;
                    sent_on = self
                        .send(&line, &mut failures, &mut last, max_attempts)
                        .await?;
                }
                // A stream this call no longer uses.
                Msg::Broken { .. } => {}
            }
        }
    }

    /// Tells the agent it may forget these finished requests.
    pub async fn ack(&self, targets: Vec<String>) -> Result<(), RelayError> {
        let r = self
            .call(
                Request {
                    id: self.new_id("ack"),
                    op: Op::Ack { targets },
                },
                |_| {},
            )
            .await?;
        match r.body {
            Body::Ok { .. } => Ok(()),
            other => Err(RelayError::Protocol {
                pod: self.shared.pod.clone(),
                why: format!("ack answered {other:?}"),
            }),
        }
    }
}

async fn open_attach(pods: &Api<Pod>, pod: &str, container: &str) -> Result<Streams, RelayError> {
    let params = AttachParams::default()
        .container(container.to_string())
        .stdin(true)
        .stdout(true)
        .stderr(false);
    let mut process = pods
        .attach(pod, &params)
        .await
        .map_err(|source| RelayError::Attach {
            pod: pod.to_string(),
            source,
        })?;
    let protocol = |why: &str| RelayError::Protocol {
        pod: pod.to_string(),
        why: why.into(),
    };
    let stdin = process.stdin().ok_or_else(|| protocol("no stdin"))?;
    let stdout = process.stdout().ok_or_else(|| protocol("no stdout"))?;
    Ok(Streams {
        stdin: Box::new(stdin),
        stdout: Box::new(stdout),
        keep: Some(Box::new(process)),
    })
}

/// One [`Connection`] per pod, shared by everything in the operator that talks to agents
/// (the session relay, runs in a session pod): two attaches to one pod's stdin could
/// interleave their lines.
#[derive(Clone)]
pub struct Pool {
    pods: Api<Pod>,
    container: String,
    conns: Arc<Mutex<HashMap<String, Connection>>>,
}

impl Pool {
    /// Connections to `container` of the pods of `pods`' namespace.
    pub fn new(pods: Api<Pod>, container: &str) -> Pool {
        Pool {
            pods,
            container: container.to_string(),
            conns: Arc::default(),
        }
    }

    /// The connection to `pod` (made on first use; it attaches at its first call).
    pub fn get(&self, pod: &str) -> Connection {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        // Connections whose stream broke with nobody waiting cost a reattach to make again:
        // dropped, so pods that are gone do not accumulate.
        conns.retain(|name, c| name == pod || c.is_open() || c.calls_in_flight() > 0);
        conns
            .entry(pod.to_string())
            .or_insert_with(|| Connection::attach_lazy(self.pods.clone(), pod, &self.container))
            .clone()
    }

    /// Forgets the connection to `pod` (its pod was deleted).
    pub fn forget(&self, pod: &str) {
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(pod);
    }

    /// Connections held.
    pub fn len(&self) -> usize {
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// No connection is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A connection to the agent of one pod for one caller at a time: the form the warm pool
/// and the cluster tests use. Built on [`Connection`].
pub struct Agent {
    conn: Connection,
    /// Reattach attempts per broken stream, with a doubling pause from 100 ms.
    pub max_attempts: u32,
}

impl Agent {
    /// Attaches to `container` of `pod` (it must run the agent with `stdin: true` and
    /// `stdinOnce: false`).
    pub async fn attach(pods: Api<Pod>, pod: &str, container: &str) -> Result<Agent, RelayError> {
        let conn = Connection::attach_lazy(pods, pod, container);
        conn.connect().await?;
        Ok(Agent {
            conn,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
        })
    }

    /// An agent over an existing connection (e.g. one of a [`Pool`]).
    pub fn from_connection(conn: Connection) -> Agent {
        Agent {
            conn,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
        }
    }

    /// The shared connection underneath.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// A request id unique within this process (`prefix` names its purpose).
    pub fn new_id(&mut self, prefix: &str) -> String {
        self.conn.new_id(prefix)
    }

    /// Drops the stream as a network failure would (tests of reconnection).
    pub fn drop_stream(&mut self) {
        if let Ok(mut link) = self.conn.shared.link.try_lock() {
            let generation = link.generation;
            self.conn
                .shared
                .break_link(&mut link, generation, "the stream was dropped");
        }
    }

    /// Sends `request` and returns its final event; `on_event` sees each event before it
    /// (stdout/stderr chunks, `lost`), in order and exactly once, across reattachments.
    pub async fn call(
        &mut self,
        request: Request,
        on_event: impl FnMut(&Response),
    ) -> Result<Response, RelayError> {
        self.conn
            .call_with(request, on_event, self.max_attempts)
            .await
    }

    /// Tells the agent it may forget these finished requests.
    pub async fn ack(&mut self, targets: Vec<String>) -> Result<(), RelayError> {
        self.conn.ack(targets).await
    }
}
