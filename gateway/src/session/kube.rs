//! Sessions on the kubernetes backend: each session is a `ToolSession` (toolrun.dev/v1alpha1)
//! that the operator turns into one agent pod with the workspace on a volume. The gateway
//! creates it and waits until it is Ready, deletes it on CloseSession or expiry, lists them
//! at start to restore open sessions, and refreshes the `toolrun.dev/last-activity`
//! annotation while the session is used (so the operator can expire sessions idle past
//! their timeout when no gateway runs). File tools reach the pod through the operator's
//! relay ([`super::files::RelayClient`]); runs are ToolRuns naming the session.
//!
//! What the gateway relies on from the operator: `status.phase` Ready with `status.podName`
//! (whose container `agent` runs `toolrun-runner agent --workspace /workspace`), Failed
//! with `status.message`, and the relay serving `SessionRelay` for that pod.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use toolrun_crd::labels::{self, label_value};
use toolrun_crd::session::{SessionApprovalMode, SessionPhase, SessionWorkspace};
use toolrun_crd::{ToolSession, ToolSessionSpec};

use super::SessionError;
use super::files::{RelayClient, SessionFiles};
use crate::config::ApprovalMode;
use crate::sandbox::kubernetes::convert::{CREATED_BY, CREATED_BY_VALUE};

/// Annotation with the owning tenant unchanged (its label may be cut down).
pub const TENANT_ANNOTATION: &str = "toolrun.dev/tenant";

/// How often a used session's `toolrun.dev/last-activity` is patched at most.
pub const ACTIVITY_EVERY: Duration = Duration::from_secs(5);

/// The kubernetes side of the session manager.
pub struct KubeSessions {
    api: Api<ToolSession>,
    relay: RelayClient,
    namespace: String,
    ready_timeout: Duration,
    runtime_class_name: Option<String>,
    storage_class_name: Option<String>,
}

/// A ToolSession found at start.
pub struct Found {
    /// Its name.
    pub name: String,
    /// The caller's id.
    pub id: String,
    /// The tenant.
    pub tenant: String,
    /// Its approval mode.
    pub approval_mode: ApprovalMode,
    /// Its idle timeout.
    pub idle: Duration,
    /// When it was made.
    pub created_at: SystemTime,
    /// Its last use the cluster knows of.
    pub last_used: SystemTime,
}

fn mode(m: ApprovalMode) -> SessionApprovalMode {
    match m {
        ApprovalMode::None => SessionApprovalMode::None,
        ApprovalMode::Safe => SessionApprovalMode::Safe,
        ApprovalMode::All => SessionApprovalMode::All,
    }
}

fn mode_back(m: SessionApprovalMode) -> ApprovalMode {
    match m {
        SessionApprovalMode::None => ApprovalMode::None,
        SessionApprovalMode::Safe => ApprovalMode::Safe,
        SessionApprovalMode::All => ApprovalMode::All,
    }
}

/// The ToolSession's name for `tenant`'s session `id`: a DNS-1123 label (`ts-`, the id's
/// allowed characters lowercased, a hash of tenant and id), so two tenants' ids, or two
/// ids differing only in case, never share a name.
pub fn session_name(tenant: &str, id: &str) -> String {
    let mut cleaned: String = id
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    cleaned.truncate(40);
    let cleaned = cleaned.trim_matches('-');
    let hash = blake3::hash(format!("{tenant}\0{id}").as_bytes());
    let hex: String = hash.as_bytes()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if cleaned.is_empty() {
        format!("ts-{hex}")
    } else {
        format!("ts-{cleaned}-{hex}")
    }
}

fn time_ms(t: SystemTime) -> String {
    k8s_openapi::jiff::Timestamp::try_from(t)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn parse_time(s: &str) -> Option<SystemTime> {
    s.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(SystemTime::from)
}

impl KubeSessions {
    /// ToolSessions in `namespace`, files through `relay`; a new session must be Ready
    /// within `ready_timeout`.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        relay: RelayClient,
        ready_timeout: Duration,
        runtime_class_name: Option<String>,
        storage_class_name: Option<String>,
    ) -> KubeSessions {
        KubeSessions {
            api: Api::namespaced(client, namespace),
            relay,
            namespace: namespace.to_string(),
            ready_timeout,
            runtime_class_name,
            storage_class_name,
        }
    }

    /// The files of session `name` of `tenant`.
    pub fn files(&self, name: &str, tenant: &str) -> SessionFiles {
        // The operator compares with the tenant label, which is the label form.
        self.relay.files(name, &label_value(tenant))
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Creates the ToolSession and waits until it is Ready (bounded); a session that fails
    /// or is not Ready in time is deleted and reported with its status message.
    pub async fn create(
        &self,
        id: &str,
        tenant: &str,
        approval_mode: ApprovalMode,
        idle: Duration,
        workspace_size_mb: Option<u64>,
    ) -> Result<String, SessionError> {
        let name = session_name(tenant, id);
        let object = ToolSession {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(BTreeMap::from([
                    (CREATED_BY.to_string(), CREATED_BY_VALUE.to_string()),
                    (labels::TENANT.to_string(), label_value(tenant)),
                    (labels::SESSION_ID.to_string(), label_value(id)),
                ])),
                annotations: Some(BTreeMap::from([
                    (labels::SESSION_ID_ANNOTATION.to_string(), id.to_string()),
                    (TENANT_ANNOTATION.to_string(), tenant.to_string()),
                    (
                        labels::LAST_ACTIVITY.to_string(),
                        time_ms(SystemTime::now()),
                    ),
                ])),
                ..ObjectMeta::default()
            },
            spec: ToolSessionSpec {
                session_id: id.to_string(),
                approval_mode: mode(approval_mode),
                idle_timeout_seconds: Some(
                    u32::try_from(idle.as_secs())
                        .unwrap_or(u32::MAX)
                        .min(toolrun_crd::session::MAX_IDLE_TIMEOUT_SECONDS),
                ),
                workspace: SessionWorkspace {
                    size_mib: workspace_size_mb.map(|m| m.clamp(16, 1_048_576) as u32),
                    storage_class_name: self.storage_class_name.clone(),
                },
                limits: Default::default(),
                runtime_class_name: self.runtime_class_name.clone(),
            },
            status: None,
        };
        // A caller that goes away while the pod starts leaves no ToolSession behind.
        let mut guard = DeleteOnDrop {
            api: Some(self.api.clone()),
            name: name.clone(),
        };
        match self.api.create(&PostParams::default(), &object).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {
                // Someone else's (another gateway's): not ours to delete.
                guard.api = None;
                return Err(SessionError::AlreadyExists(id.to_string()));
            }
            Err(e) => {
                return Err(SessionError::Backend(format!(
                    "creating ToolSession {}/{name}: {e}",
                    self.namespace
                )));
            }
        }
        let settled = |s: Option<&ToolSession>| {
            s.and_then(|s| s.status.as_ref())
                .and_then(|st| st.phase)
                .is_some_and(|p| p != SessionPhase::Pending)
        };
        let waited = tokio::time::timeout(
            self.ready_timeout,
            await_condition(self.api.clone(), &name, settled),
        )
        .await;
        let problem = match waited {
            Ok(Ok(Some(s))) if s.ready_pod().is_some() => {
                guard.api = None;
                return Ok(name);
            }
            Ok(Ok(Some(s))) => {
                let st = s.status.unwrap_or_default();
                format!(
                    "phase {}: {}",
                    st.phase.map_or("?", |p| p.as_str()),
                    st.message.unwrap_or_default()
                )
            }
            Ok(Ok(None)) => "it was deleted while starting".to_string(),
            Ok(Err(e)) => format!("watching it failed: {e}"),
            Err(_) => {
                let message = self
                    .api
                    .get_opt(&name)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|s| s.status)
                    .and_then(|s| s.message)
                    .unwrap_or_else(|| "no status yet".into());
                format!(
                    "not Ready within {} s (is the toolrun operator running?): {message}",
                    self.ready_timeout.as_secs()
                )
            }
        };
        guard.api = None;
        self.delete(&name).await;
        Err(SessionError::Backend(format!(
            "session {id:?} (ToolSession {}/{name}) could not start: {problem}",
            self.namespace
        )))
    }

    /// Deletes ToolSession `name` (already gone is fine); failures are logged.
    pub async fn delete(&self, name: &str) -> bool {
        match self.api.delete(name, &DeleteParams::background()).await {
            Ok(_) => true,
            Err(kube::Error::Api(e)) if e.code == 404 => true,
            Err(e) => {
                tracing::warn!(toolsession = name, error = %e, "deleting a ToolSession failed");
                false
            }
        }
    }

    /// Records a use of session `name` (the operator derives `status.expiresAt`).
    pub async fn touch(&self, name: &str, at: SystemTime) {
        let patch = serde_json::json!({
            "metadata": {"annotations": {labels::LAST_ACTIVITY: time_ms(at)}}
        });
        if let Err(e) = self
            .api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::debug!(toolsession = name, error = %e, "last-activity patch failed");
        }
    }

    /// The gateway's ToolSessions, for a restart: the ones not being deleted.
    pub async fn list(&self) -> Result<Vec<Found>, SessionError> {
        let list = self
            .api
            .list(&ListParams::default().labels(&format!("{CREATED_BY}={CREATED_BY_VALUE}")))
            .await
            .map_err(|e| SessionError::Backend(format!("listing ToolSessions: {e}")))?;
        let now = SystemTime::now();
        Ok(list
            .items
            .into_iter()
            .filter(|s| s.metadata.deletion_timestamp.is_none())
            .filter_map(|s| {
                let annotations = s.metadata.annotations.clone().unwrap_or_default();
                let name = s.metadata.name.clone()?;
                let created_at = s
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| SystemTime::from(t.0))
                    .unwrap_or(now);
                let last_used = annotations
                    .get(labels::LAST_ACTIVITY)
                    .and_then(|t| parse_time(t))
                    .unwrap_or(created_at);
                Some(Found {
                    name,
                    id: annotations
                        .get(labels::SESSION_ID_ANNOTATION)
                        .cloned()
                        .unwrap_or_else(|| s.spec.session_id.clone()),
                    tenant: annotations
                        .get(TENANT_ANNOTATION)
                        .cloned()
                        .unwrap_or_else(|| s.tenant().to_string()),
                    approval_mode: mode_back(s.spec.approval_mode),
                    idle: Duration::from_secs(u64::from(
                        s.spec.idle_timeout_seconds.unwrap_or(1800),
                    )),
                    created_at,
                    last_used,
                })
            })
            .collect())
    }
}

/// Deletes a ToolSession whose creation was abandoned (the future dropped).
struct DeleteOnDrop {
    api: Option<Api<ToolSession>>,
    name: String,
}

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        if let Some(api) = self.api.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let name = std::mem::take(&mut self.name);
            rt.spawn(async move {
                if let Err(e) = api.delete(&name, &DeleteParams::background()).await {
                    tracing::warn!(toolsession = %name, error = %e, "deleting an abandoned ToolSession failed");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels_and_distinct_per_tenant_and_case() {
        let cases = [
            ("", "s-0123abcd"),
            ("acme", "s-0123abcd"),
            ("", "S-0123ABCD"),
            ("", "my_session"),
            ("", &"x".repeat(64)),
            ("", "___"),
        ];
        let mut seen = std::collections::HashSet::new();
        for (tenant, id) in cases {
            let n = session_name(tenant, id);
            assert!(labels::is_dns_label(&n), "{n:?}");
            assert!(seen.insert(n.clone()), "{n} repeats");
        }
        assert_eq!(session_name("a", "b"), session_name("a", "b"));
        assert!(session_name("", "s-0123abcd").starts_with("ts-s-0123abcd-"));
    }

    #[test]
    fn times_round_trip() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let s = time_ms(t);
        assert_eq!(parse_time(&s), Some(t), "{s}");
    }
}
