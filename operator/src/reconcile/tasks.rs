//! Bookkeeping of tasks that each watch one pod for one object (a log follower, a run
//! carried to an agent), during one term of leadership.
//!
//! An entry is kept per pod UID from the task's start until the object is finished or gone
//! ([`PodTasks::forget_run`]) or the term ends, so a pod gets at most one task per term.
//! The task's outcome is kept in the entry; an outcome that should be looked at triggers
//! a reconcile of its object through the stream [`PodTasks::start_term`] returned.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;

/// Why [`PodTasks::begin`] started no task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No term of leadership is on.
    NoTerm,
    /// The pod has or had a task in this term.
    Known,
    /// The most tasks allowed are running.
    Full,
}

struct Entry<T> {
    /// The object the pod serves.
    object: String,
    cancel: CancellationToken,
    /// `None` while the task runs.
    outcome: Option<T>,
}

struct State<K: Resource<DynamicType = ()>, T> {
    /// By pod UID.
    entries: HashMap<String, Entry<T>>,
    /// Reconcile trigger of the current term; `None` between terms.
    trigger: Option<UnboundedSender<ObjectRef<K>>>,
}

/// Tasks on pods of objects of kind `K` in one namespace, with outcomes of type `T`.
pub struct PodTasks<K: Resource<DynamicType = ()>, T> {
    namespace: String,
    state: Mutex<State<K, T>>,
}

impl<K: Resource<DynamicType = ()>, T: Clone> PodTasks<K, T> {
    /// No task, no term, in `namespace`.
    pub fn new(namespace: String) -> Self {
        PodTasks {
            namespace,
            state: Mutex::new(State {
                entries: HashMap::new(),
                trigger: None,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State<K, T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Begins a term of leadership (ending the last one); the stream triggers reconciles
    /// of objects whose outcome arrived.
    pub fn start_term(&self) -> UnboundedReceiver<ObjectRef<K>> {
        let (tx, rx) = unbounded();
        let mut st = self.state();
        stop(&mut st);
        st.trigger = Some(tx);
        rx
    }

    /// Ends the term: every task is cancelled and every outcome dropped.
    pub fn end_term(&self) {
        stop(&mut self.state());
    }

    /// The outcome of the task on the pod with `pod_uid`, once it ended.
    pub fn outcome(&self, pod_uid: &str) -> Option<T> {
        self.state().entries.get(pod_uid)?.outcome.clone()
    }

    /// Tasks still running.
    pub fn live(&self) -> usize {
        self.state()
            .entries
            .values()
            .filter(|e| e.outcome.is_none())
            .count()
    }

    /// Cancels and forgets the tasks of `object` (finished, deleted).
    pub fn forget_run(&self, object: &str) {
        self.state().entries.retain(|_, e| {
            if e.object == object {
                e.cancel.cancel();
            }
            e.object != object
        });
    }

    /// Registers a task on the pod with `pod_uid` for `object`, unless no term is on, the
    /// pod had one in this term, or `max` tasks are running. Returns the token that
    /// cancels it.
    pub fn begin(
        &self,
        pod_uid: &str,
        object: &str,
        max: usize,
    ) -> Result<CancellationToken, Refused> {
        let mut st = self.state();
        if st.trigger.is_none() {
            return Err(Refused::NoTerm);
        }
        if st.entries.contains_key(pod_uid) {
            return Err(Refused::Known);
        }
        if st.entries.values().filter(|e| e.outcome.is_none()).count() >= max {
            return Err(Refused::Full);
        }
        let cancel = CancellationToken::new();
        st.entries.insert(
            pod_uid.to_string(),
            Entry {
                object: object.to_string(),
                cancel: cancel.clone(),
                outcome: None,
            },
        );
        Ok(cancel)
    }

    /// The task on the pod with `pod_uid` ended with `outcome`; when `look` the object is
    /// reconciled. Nothing happens if the entry was forgotten meanwhile.
    pub fn ended(&self, pod_uid: &str, object: &str, outcome: T, look: bool) {
        let mut st = self.state();
        let Some(entry) = st.entries.get_mut(pod_uid) else {
            return;
        };
        entry.outcome = Some(outcome);
        if look && let Some(trigger) = &st.trigger {
            let _ = trigger.unbounded_send(ObjectRef::new(object).within(&self.namespace));
        }
    }
}

fn stop<K: Resource<DynamicType = ()>, T>(st: &mut State<K, T>) {
    for e in st.entries.values() {
        e.cancel.cancel();
    }
    st.entries.clear();
    st.trigger = None;
}
