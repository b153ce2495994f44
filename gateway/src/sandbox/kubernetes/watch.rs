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
        let shared = Arc::new(SharedWatch::new(namespace, store, restarts));
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

    fn new(namespace: &str, store: Store<ToolRun>, restarts: Counter) -> SharedWatch {
        SharedWatch {
            namespace: namespace.to_string(),
            waiters: Mutex::new(HashMap::new()),
            store,
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
                language: toolrun_crd::Language::Python,
                code: "pass".into(),
                args: Vec::new(),
                env: Vec::new(),
                stdin: String::new(),
                limits: Default::default(),
                ttl_seconds_after_finished: None,
                runtime_class_name: None,
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

    /// Feeds `event` through the reflector's writer, then the demultiplexer, as the
    /// watch task does.
    fn feed(
        w: &SharedWatch,
        writer: &mut reflector::store::Writer<ToolRun>,
        event: watcher::Event<ToolRun>,
    ) {
        writer.apply_watcher_event(&event);
        w.handle(Ok(event));
    }

    #[test]
    fn changes_reach_only_their_waiter_and_a_relist_delivers_the_current_state() {
        let (store, mut writer) = reflector::store();
        let w = SharedWatch::new("ns", store, Counter::default());
        feed(&w, &mut writer, watcher::Event::Init);
        feed(&w, &mut writer, watcher::Event::InitDone);
        let mut a = w.register("run-a");
        let b = w.register("run-b");
        feed(
            &w,
            &mut writer,
            watcher::Event::Apply(run("run-a", Some(Phase::Running))),
        );
        assert!(a.has_changed().unwrap());
        assert_eq!(phase(&a.borrow_and_update()), Some(Phase::Running));
        assert!(!b.has_changed().unwrap());

        // The watch breaks; while it is down run-a finishes. The relist's InitApply and
        // InitDone hand the waiter the finished state.
        w.handle(Err(watcher::Error::NoResourceVersion));
        assert_eq!(w.restarts.get(), 1);
        feed(&w, &mut writer, watcher::Event::Init);
        feed(
            &w,
            &mut writer,
            watcher::Event::InitApply(run("run-a", Some(Phase::Succeeded))),
        );
        feed(&w, &mut writer, watcher::Event::InitDone);
        assert_eq!(phase(&a.borrow_and_update()), Some(Phase::Succeeded));

        // A run that finished before its waiter registered is seen at registration.
        let late = w.register("run-a");
        assert_eq!(phase(&late.borrow()), Some(Phase::Succeeded));

        feed(&w, &mut writer, watcher::Event::Delete(run("run-b", None)));
        assert!(matches!(*b.borrow(), Seen::Deleted));
        w.unregister("run-b");
        assert_eq!(w.waiters(), 1);
    }
}
