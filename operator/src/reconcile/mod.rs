//! What every kind's reconciler needs, written once: the shared [`Context`], the one field
//! manager, the error of a failed reconcile ([`Error`], [`kube_err`]), the status write
//! carrying the resourceVersion that was read ([`apply_status`]), events
//! ([`Context::event`]), the backoff of failed reconciles ([`Backoff`]), the fresh-read
//! memo ([`Fresh`]) and the bookkeeping of tasks watching one pod each ([`PodTasks`]).
//!
//! The kinds ([`crate::toolrun`], [`crate::toolsession`], [`crate::warmpool`]) keep only
//! what is theirs.

mod fresh;
mod tasks;

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use toolrun_crd::ToolRun;
use tracing::{info, warn};

pub use fresh::Fresh;
pub use tasks::{PodTasks, Refused};

use crate::config::{ControllerConfig, OperatorConfig};
use crate::metrics::Metrics;
use crate::toolrun::follow::Followers;
use crate::warmpool::Pool;
use crate::warmpool::runs::AgentRuns;

/// The one field manager of everything the operator writes.
pub const FIELD_MANAGER: &str = "toolrun-operator";

/// Longest event note (the API server refuses longer ones).
const MAX_NOTE_BYTES: usize = 1000;

/// Why a reconcile failed; the object is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API request failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The object lacks a name, namespace or uid (never true of one from the API server).
    #[error("object without {0}")]
    Metadata(&'static str),
}

/// Maps a failed API request to an [`Error`] saying what was being done.
pub fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Kube { action, source }
}

/// What every reconcile shares.
pub struct Context {
    /// The API client (rate-limited by the caller's choice).
    pub client: Client,
    /// Builders' configuration.
    pub config: OperatorConfig,
    /// How long a pod may be stuck pending.
    pub pending_grace: Duration,
    /// Events.
    pub recorder: Recorder,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The ToolRuns this process wrote or read last (see [`Fresh`]).
    pub fresh_runs: Fresh<ToolRun>,
    /// Failed ToolRun reconciles in a row.
    pub run_backoff: Backoff,
    /// Failed ToolSession reconciles in a row.
    pub session_backoff: Backoff,
    /// Followers of running pods' logs.
    pub followers: Arc<Followers>,
    /// The warm pods (kept by [`crate::warmpool::keep`] while leading).
    pub pool: Arc<Pool>,
    /// Runs carried to claimed warm pods' and session pods' agents.
    pub agent_runs: Arc<AgentRuns>,
    /// One attach stream per agent pod in this process, shared by the session relay and
    /// the runs carried to agents (two attaches to one pod's stdin would interleave).
    pub relay_pool: crate::relay::Pool,
}

impl Context {
    /// A context for `client`; events are reported as `toolrun-operator` from `instance`.
    pub fn new(
        client: Client,
        config: OperatorConfig,
        ctl: &ControllerConfig,
        instance: String,
        metrics: Arc<Metrics>,
    ) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(instance),
        };
        let relay_pool =
            crate::session::relay_server::session_pool(client.clone(), &config.namespace);
        let (run_min, run_max) = crate::toolrun::controller::BACKOFF;
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            config: config.clone(),
            pending_grace: ctl.pending_grace,
            metrics,
            fresh_runs: Fresh::new(config.namespace.clone()),
            run_backoff: Backoff::new(run_min, run_max),
            session_backoff: Backoff::new(
                crate::toolsession::RETRY_AFTER,
                crate::toolsession::RETRY_AFTER,
            ),
            followers: Arc::new(Followers::new(
                ctl.max_log_followers,
                config.namespace.clone(),
            )),
            pool: Arc::new(Pool::default()),
            agent_runs: Arc::new(AgentRuns::new(config.namespace.clone())),
            relay_pool,
        }
    }

    /// The API of `K` in the sandbox namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    /// Publishes an event about `obj` (the note cut to what the API server takes); a
    /// failure is logged only.
    pub async fn event<K>(&self, obj: &K, type_: EventType, reason: &str, note: String)
    where
        K: Resource<DynamicType = ()>,
    {
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(cut_note(note)),
            action: reason.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &obj.object_ref(&())).await {
            warn!(
                kind = %K::kind(&()),
                name = %obj.name_any(),
                reason,
                error = %e,
                "publishing an event failed"
            );
        }
    }

    /// Deletes the sandbox pod `name` at once (a missing one is fine) and drops this
    /// process's attach stream to it.
    pub async fn delete_pod(&self, name: &str) -> Result<(), Error> {
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        match self.api::<Pod>().delete(name, &dp).await {
            Ok(_) => info!(pod = %name, "deleted pod"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(kube_err(format!("deleting pod {name}"))(e)),
        }
        self.relay_pool.forget(name);
        Ok(())
    }
}

/// `note` cut to [`MAX_NOTE_BYTES`] on a character boundary.
fn cut_note(mut note: String) -> String {
    if note.len() > MAX_NOTE_BYTES {
        let mut cut = MAX_NOTE_BYTES;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
    }
    note
}

/// The server-side apply patch writing `status` to `obj`'s status subresource, carrying
/// the resourceVersion `obj` was read at: the write fails with a conflict when the object
/// changed since, so a status decided on a stale copy is never written.
pub fn status_patch<K>(obj: &K, status: &impl Serialize) -> serde_json::Value
where
    K: Resource<DynamicType = ()>,
{
    serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": {
            "name": obj.name_any(),
            "resourceVersion": obj.meta().resource_version,
        },
        "status": status,
    })
}

/// Applies [`status_patch`] under [`FIELD_MANAGER`]; returns the object written.
pub async fn apply_status<K>(api: &Api<K>, obj: &K, status: &impl Serialize) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let name = obj.name_any();
    api.patch_status(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&status_patch(obj, status)),
    )
    .await
    .map_err(kube_err(format!(
        "writing the status of {} {name}",
        K::kind(&())
    )))
}

/// Failed reconciles in a row per object, and the delay before the next try: doubling
/// from `min` up to `max` (`min == max`: a fixed delay).
pub struct Backoff {
    min: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    /// Doubling from `min` up to `max`.
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// The object `name` was reconciled: its count starts again.
    pub fn succeeded(&self, name: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
    }

    /// One more failure of `name`: the failures in a row and the delay before the next try.
    pub fn failed(&self, name: &str) -> (u32, Duration) {
        let n = {
            let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
            let n = failures.entry(name.to_string()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        };
        let delay = self
            .min
            .saturating_mul(1u32 << (n - 1).min(16))
            .min(self.max);
        (n, delay)
    }

    /// The error policy of every kind: counts the failure of `obj`, logs it and requeues
    /// it after the backoff.
    pub fn retry<K>(&self, obj: &K, error: &Error) -> Action
    where
        K: Resource<DynamicType = ()>,
    {
        let name = obj.name_any();
        let (n, delay) = self.failed(&name);
        warn!(
            kind = %K::kind(&()),
            %name,
            error = %error,
            failures = n,
            retry_in = ?delay,
            "reconcile failed"
        );
        Action::requeue(delay)
    }
}

#[cfg(test)]
mod tests;
