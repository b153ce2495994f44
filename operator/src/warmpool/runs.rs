//! Runs carried to a warm pod's agent through the relay, one task per claimed pod.
//!
//! The request's id is the ToolRun's uid, so sending it again (a new term of leadership,
//! a restarted operator, a broken attach stream) never runs the program twice: the agent
//! answers a repeat with the same run's events and record. When the final event arrives
//! the outcome is kept under the pod's UID and the run is reconciled (as a log follower's
//! record is, see [`crate::toolrun::follow`]); [`crate::toolrun::decide`] records it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;
use toolrun_crd::ToolRun;
use toolrun_runner::RunRecord;
use toolrun_runner::agent::proto::{Body, Op, Request};
use tracing::{debug, warn};

use crate::relay;

struct Entry {
    run: String,
    cancel: CancellationToken,
    outcome: Option<Result<RunRecord, String>>,
}

#[derive(Default)]
struct State {
    /// By pod UID.
    entries: HashMap<String, Entry>,
    trigger: Option<UnboundedSender<ObjectRef<ToolRun>>>,
}

/// The runs this replica is carrying to warm pods.
pub struct AgentRuns {
    namespace: String,
    state: Mutex<State>,
}

impl AgentRuns {
    /// Runs in `namespace`.
    pub fn new(namespace: String) -> Self {
        AgentRuns {
            namespace,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Begins a term of leadership; the stream triggers reconciles of runs whose outcome
    /// arrived.
    pub fn start_term(&self) -> UnboundedReceiver<ObjectRef<ToolRun>> {
        let (tx, rx) = unbounded();
        let mut st = self.state();
        stop(&mut st);
        st.trigger = Some(tx);
        rx
    }

    /// Ends the term: every call is dropped (the next leader sends the same ids again).
    pub fn end_term(&self) {
        stop(&mut self.state());
    }

    /// The record the agent of the pod with `pod_uid` returned.
    pub fn record(&self, pod_uid: &str) -> Option<RunRecord> {
        match &self.state().entries.get(pod_uid)?.outcome {
            Some(Ok(r)) => Some(r.clone()),
            _ => None,
        }
    }

    /// Why carrying the request to the pod with `pod_uid` failed.
    pub fn failure(&self, pod_uid: &str) -> Option<String> {
        match &self.state().entries.get(pod_uid)?.outcome {
            Some(Err(e)) => Some(e.clone()),
            _ => None,
        }
    }

    /// Calls in progress.
    pub fn live(&self) -> usize {
        self.state()
            .entries
            .values()
            .filter(|e| e.outcome.is_none())
            .count()
    }

    /// Drops what is kept for the run `run` (finished, deleted).
    pub fn forget_run(&self, run: &str) {
        self.state().entries.retain(|_, e| {
            if e.run == run {
                e.cancel.cancel();
            }
            e.run != run
        });
    }

    /// Sends `request` over `conn` to the agent of `pod` (bound to the ToolRun `run`)
    /// unless it is being or was sent in this term, or no term is on. Returns whether a
    /// call started.
    pub fn ensure(
        self: &Arc<Self>,
        conn: relay::Connection,
        run: &str,
        pod: &Pod,
        request: Request,
    ) -> bool {
        let Some(uid) = pod.metadata.uid.clone() else {
            return false;
        };
        let pod_name = pod.name_any();
        let cancel = CancellationToken::new();
        {
            let mut st = self.state();
            if st.trigger.is_none() || st.entries.contains_key(&uid) {
                return false;
            }
            st.entries.insert(
                uid.clone(),
                Entry {
                    run: run.to_string(),
                    cancel: cancel.clone(),
                    outcome: None,
                },
            );
        }
        let runs = Arc::clone(self);
        let run = run.to_string();
        tokio::spawn(async move {
            let call = async {
                let mut agent = relay::Agent::from_connection(conn);
                let response = agent
                    .call(request, |_| {})
                    .await
                    .map_err(|e| e.to_string())?;
                match response.body {
                    Body::Result(record) => Ok(record),
                    Body::Error(e) => Err(format!("the agent refused the run: {e:?}")),
                    other => Err(format!("the agent answered {other:?}")),
                }
            };
            let outcome = tokio::select! {
                _ = cancel.cancelled() => return,
                outcome = call => outcome,
            };
            match &outcome {
                Ok(r) => {
                    debug!(%run, pod = %pod_name, verdict = ?r.verdict, "the agent returned the record")
                }
                Err(e) => {
                    warn!(%run, pod = %pod_name, error = %e, "carrying the run to the agent failed")
                }
            }
            runs.ended(&uid, &run, outcome);
        });
        true
    }

    fn ended(&self, uid: &str, run: &str, outcome: Result<RunRecord, String>) {
        let mut st = self.state();
        let Some(entry) = st.entries.get_mut(uid) else {
            return;
        };
        entry.outcome = Some(outcome);
        if let Some(trigger) = &st.trigger {
            let _ = trigger.unbounded_send(ObjectRef::new(run).within(&self.namespace));
        }
    }
}

/// The agent request of a run: its id is the ToolRun's uid.
pub fn request(run: &ToolRun, spec: toolrun_runner::RunSpec) -> Option<Request> {
    Some(Request {
        id: run.metadata.uid.clone()?,
        op: Op::Run {
            spec: Box::new(spec),
        },
    })
}

fn stop(st: &mut State) {
    for e in st.entries.values() {
        e.cancel.cancel();
    }
    st.entries.clear();
    st.trigger = None;
}
