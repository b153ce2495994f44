//! Runs carried to a warm pod's agent through the relay, one task per claimed pod.
//!
//! The request's id is the ToolRun's uid, so sending it again (a new term of leadership,
//! a restarted operator, a broken attach stream) never runs the program twice: the agent
//! answers a repeat with the same run's events and record. When the final event arrives
//! the outcome is kept under the pod's UID and the run is reconciled (as a log follower's
//! record is, see [`crate::toolrun::follow`]); [`crate::toolrun::decide`] records it.

use std::sync::Arc;

use futures::channel::mpsc::UnboundedReceiver;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use toolrun_crd::ToolRun;
use toolrun_runner::RunRecord;
use toolrun_runner::agent::proto::{Body, Op, Request};
use tracing::{debug, warn};

use crate::reconcile::PodTasks;
use crate::relay;

/// The runs this replica is carrying to warm pods: per pod UID, the agent's record or why
/// carrying the request failed.
pub struct AgentRuns {
    tasks: PodTasks<ToolRun, Result<RunRecord, String>>,
}

impl AgentRuns {
    /// Runs in `namespace`.
    pub fn new(namespace: String) -> Self {
        AgentRuns {
            tasks: PodTasks::new(namespace),
        }
    }

    /// Begins a term of leadership; the stream triggers reconciles of runs whose outcome
    /// arrived.
    pub fn start_term(&self) -> UnboundedReceiver<ObjectRef<ToolRun>> {
        self.tasks.start_term()
    }

    /// Ends the term: every call is dropped (the next leader sends the same ids again).
    pub fn end_term(&self) {
        self.tasks.end_term();
    }

    /// The record the agent of the pod with `pod_uid` returned.
    pub fn record(&self, pod_uid: &str) -> Option<RunRecord> {
        self.tasks.outcome(pod_uid)?.ok()
    }

    /// Why carrying the request to the pod with `pod_uid` failed.
    pub fn failure(&self, pod_uid: &str) -> Option<String> {
        self.tasks.outcome(pod_uid)?.err()
    }

    /// Calls in progress.
    pub fn live(&self) -> usize {
        self.tasks.live()
    }

    /// Drops what is kept for the run `run` (finished, deleted).
    pub fn forget_run(&self, run: &str) {
        self.tasks.forget_run(run);
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
        let Ok(cancel) = self.tasks.begin(&uid, run, usize::MAX) else {
            return false;
        };
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
            runs.tasks.ended(&uid, &run, outcome, true);
        });
        true
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
