//! One watch on the gateway's ToolRuns, shared by every in-flight call.
//!
//! Each call registers a waiter under its ToolRun's name *before* creating it; the watch
//! task hands every change of that ToolRun to the waiter (a `tokio::sync::watch` slot that
//! keeps the latest state, so a run that finishes before its call looks is still seen).
//! After the watch breaks, the relist delivers every listed ToolRun again, so a change
//! made while the watch was down reaches its waiter too.
//!
//! No reflector store: finished ToolRuns stay until their TTL and may carry up to 2 x 256
//! KiB of output each; only the waiters' latest states are held, so memory follows the
//! calls in flight, not the namespace's history.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use toolrun_crd::ToolRun;

/// What a waiter last saw of its ToolRun.
#[derive(Debug, Clone, Default)]
pub enum Seen {
    /// Nothing yet.
    #[default]
    Nothing,
    /// The latest version.
    Object(Arc<ToolRun>),
    /// It was deleted.
    Deleted,
}

/// The shared watch: waiters by ToolRun name.
pub struct SharedWatch {
    waiters: Mutex<HashMap<String, watch::Sender<Seen>>>,
    /// True once the first list is complete.
    listed: watch::Sender<bool>,
    last_error: Mutex<Option<String>>,
    restarts: Counter,
}

impl SharedWatch {
    /// Starts the watch on `api` (label-selected by `selector`); it runs until `stop`.
    pub fn start(
        api: Api<ToolRun>,
        selector: &str,
        restarts: Counter,
        stop: CancellationToken,
    ) -> Arc<SharedWatch> {
        let shared = Arc::new(SharedWatch::new(restarts));
        let config = watcher::Config::default().labels(selector);
        let events = watcher(api, config).default_backoff();
        let task = shared.clone();
        tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            loop {
                let event = tokio::select! {
                    _ = stop.cancelled() => break,
                    e = events.next() => e,
                };
                let Some(event) = event else { break };
                task.handle(event);
            }
            tracing::debug!("kubernetes backend: ToolRun watch stopped");
        });
        shared
    }

    fn new(restarts: Counter) -> SharedWatch {
        SharedWatch {
            waiters: Mutex::new(HashMap::new()),
            listed: watch::channel(false).0,
            last_error: Mutex::new(None),
            restarts,
        }
    }

    fn handle(&self, event: Result<watcher::Event<ToolRun>, watcher::Error>) {
        match event {
            Ok(watcher::Event::Apply(tr) | watcher::Event::InitApply(tr)) => {
                self.deliver(&tr.metadata.name.clone().unwrap_or_default(), || {
                    Seen::Object(Arc::new(tr))
                });
            }
            Ok(watcher::Event::Delete(tr)) => {
                self.deliver(&tr.metadata.name.clone().unwrap_or_default(), || {
                    Seen::Deleted
                });
            }
            Ok(watcher::Event::Init) => {}
            Ok(watcher::Event::InitDone) => {
                *self.last_error.lock().expect("not poisoned") = None;
                self.listed.send_replace(true);
            }
            Err(e) => {
                self.restarts.inc();
                tracing::warn!(error = %e, "kubernetes backend: ToolRun watch failed; retrying");
                *self.last_error.lock().expect("not poisoned") = Some(e.to_string());
            }
        }
    }

    fn deliver(&self, name: &str, seen: impl FnOnce() -> Seen) {
        if let Some(tx) = self.waiters.lock().expect("not poisoned").get(name) {
            tx.send_replace(seen());
        }
    }

    /// Registers a waiter for the ToolRun `name` (before it is created). The waiter is
    /// removed by [`SharedWatch::unregister`].
    pub fn register(&self, name: &str) -> watch::Receiver<Seen> {
        let (tx, rx) = watch::channel(Seen::Nothing);
        self.waiters
            .lock()
            .expect("not poisoned")
            .insert(name.to_string(), tx);
        rx
    }

    /// Removes the waiter for `name`.
    pub fn unregister(&self, name: &str) {
        self.waiters.lock().expect("not poisoned").remove(name);
    }

    /// Calls waiting now.
    pub fn waiters(&self) -> usize {
        self.waiters.lock().expect("not poisoned").len()
    }

    /// Waits until the first list is complete; on timeout, the last watch error.
    pub async fn ready(&self, limit: std::time::Duration) -> Result<(), String> {
        let mut listed = self.listed.subscribe();
        match tokio::time::timeout(limit, listed.wait_for(|l| *l)).await {
            Ok(_) => Ok(()),
            Err(_) => Err(self
                .last_error
                .lock()
                .expect("not poisoned")
                .clone()
                .unwrap_or_else(|| format!("no complete list within {limit:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::api::ObjectMeta;
    use toolrun_crd::{Phase, ToolRunSpec, ToolRunStatus};

    use super::*;

    fn run(name: &str, phase: Option<Phase>) -> ToolRun {
        let mut tr = ToolRun::new(
            name,
            ToolRunSpec {
                tool: "run_code".into(),
                call_id: "c".into(),
                language: "python".into(),
                code: "pass".into(),
                image: None,
                command: Vec::new(),
                args: Vec::new(),
                env: Vec::new(),
                stdin: String::new(),
                limits: Default::default(),
                ttl_seconds_after_finished: None,
                runtime_class_name: None,
                session: None,
                cancel: false,
            },
        );
        tr.metadata = ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            ..ObjectMeta::default()
        };
        tr.status = phase.map(|p| ToolRunStatus {
            phase: Some(p),
            ..ToolRunStatus::default()
        });
        tr
    }

    fn phase(seen: &Seen) -> Option<Phase> {
        match seen {
            Seen::Object(tr) => tr.status.as_ref().and_then(|s| s.phase),
            _ => None,
        }
    }

    #[tokio::test]
    async fn changes_reach_only_their_waiter_and_a_relist_delivers_the_current_state() {
        let w = SharedWatch::new(Counter::default());
        assert!(w.ready(std::time::Duration::from_millis(10)).await.is_err());
        w.handle(Ok(watcher::Event::Init));
        w.handle(Ok(watcher::Event::InitDone));
        w.ready(std::time::Duration::from_millis(10)).await.unwrap();
        let mut a = w.register("run-a");
        let b = w.register("run-b");
        w.handle(Ok(watcher::Event::Apply(run(
            "run-a",
            Some(Phase::Running),
        ))));
        assert!(a.has_changed().unwrap());
        assert_eq!(phase(&a.borrow_and_update()), Some(Phase::Running));
        assert!(!b.has_changed().unwrap());
        // Changes of ToolRuns nobody waits for are dropped.
        w.handle(Ok(watcher::Event::Apply(run(
            "run-z",
            Some(Phase::Running),
        ))));
        assert_eq!(w.waiters(), 2);

        // The watch breaks; while it is down run-a finishes. The relist hands the waiter
        // the finished state.
        w.handle(Err(watcher::Error::NoResourceVersion));
        assert_eq!(w.restarts.get(), 1);
        w.handle(Ok(watcher::Event::Init));
        w.handle(Ok(watcher::Event::InitApply(run(
            "run-a",
            Some(Phase::Succeeded),
        ))));
        w.handle(Ok(watcher::Event::InitDone));
        assert_eq!(phase(&a.borrow_and_update()), Some(Phase::Succeeded));

        w.handle(Ok(watcher::Event::Delete(run("run-b", None))));
        assert!(matches!(*b.borrow(), Seen::Deleted));
        w.unregister("run-b");
        assert_eq!(w.waiters(), 1);
    }
}
