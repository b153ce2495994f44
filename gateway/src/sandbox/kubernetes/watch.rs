//! One watch on the gateway's ToolRuns, shared by every in-flight call.
//!
//! Each call registers a waiter under its ToolRun's name *before* creating it; the watch
//! task hands every change of that ToolRun to the waiter. After a (re)list, each waiter
//! gets the object's current state from the reflector's store, so a change that happened
//! while the watch was down (a run that finished meanwhile) is still seen.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
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

/// The shared watch: waiters by ToolRun name, and the reflector's store.
pub struct SharedWatch {
    namespace: String,
    waiters: Mutex<HashMap<String, watch::Sender<Seen>>>,
    store: Store<ToolRun>,
    last_error: Mutex<Option<String>>,
    restarts: Counter,
}

impl SharedWatch {
    /// Starts the watch on `api` (label-selected by `selector`); it runs until `stop`.
    pub fn start(
        api: Api<ToolRun>,
        namespace: &str,
        selector: &str,
        restarts: Counter,
        stop: CancellationToken,
    ) -> Arc<SharedWatch> {
        let (store, writer) = reflector::store();
        let shared = Arc::new(SharedWatch {
            namespace: namespace.to_string(),
            waiters: Mutex::new(HashMap::new()),
            store,
            last_error: Mutex::new(None),
            restarts,
        });
        let config = watcher::Config::default().labels(selector);
        let events = watcher(api, config).default_backoff().reflect(writer);
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
                // The list is complete: give every waiter the current state (a relist
                // after a gap may have skipped the change it waits for).
                let waiters = self.waiters.lock().expect("not poisoned");
                for (name, tx) in waiters.iter() {
                    let key = ObjectRef::new(name).within(&self.namespace);
                    if let Some(tr) = self.store.get(&key) {
                        tx.send_replace(Seen::Object(tr));
                    }
                }
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
        let key = ObjectRef::new(name).within(&self.namespace);
        let initial = match self.store.get(&key) {
            Some(tr) => Seen::Object(tr),
            None => Seen::Nothing,
        };
        let (tx, rx) = watch::channel(initial);
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
        match tokio::time::timeout(limit, self.store.wait_until_ready()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err("the watch stopped before its first list".into()),
            Err(_) => Err(self
                .last_error
                .lock()
                .expect("not poisoned")
                .clone()
                .unwrap_or_else(|| format!("no complete list within {limit:?}"))),
        }
    }
}
