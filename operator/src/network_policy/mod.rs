//! The deny-all NetworkPolicy of the sandbox namespace
//! ([`crate::toolrun::builders::network_policy`]), kept in place.
//!
//! Every replica applies it at start-up ([`ensure`]; the chart ships the same policy under
//! the same name). While this replica leads, [`guard`] watches it (a watch on that one name
//! in the sandbox namespace) and applies it again as soon as it is deleted or its spec no
//! longer denies everything: typically within a second of the change (the watch event,
//! then one apply). Each restoration is counted in
//! `toolrun_operator_network_policy_restored_total`, logged as a warning and reported as a
//! `Restored` Warning event on the policy.
//!
//! [`drift`] is the pure half: whether the observed policy differs from the desired one.
//! Specs are compared after the API server's defaulting is applied to both ([`normalize`]),
//! so a policy differing only in what the server adds (metadata, defaults, the chart's
//! labels) is left alone, while any change of what it selects or allows is undone.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::reconcile::{Context, Error, FIELD_MANAGER, kube_err};
use crate::toolrun::builders::{NETWORK_POLICY_NAME, network_policy};

/// A restoration that failed is tried again after this long (or at the next change).
const RETRY: Duration = Duration::from_secs(5);

/// How the observed policy differs from the desired one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drift {
    /// There is none.
    Missing,
    /// Its spec selects or allows something else.
    SpecChanged,
}

impl Drift {
    fn as_str(self) -> &'static str {
        match self {
            Drift::Missing => "it was deleted",
            Drift::SpecChanged => "its spec was changed",
        }
    }
}

/// Whether `observed` (`None`: there is none) must be replaced by `desired`, and why.
/// A policy being deleted is left to go: its deletion is seen next.
pub fn drift(observed: Option<&NetworkPolicy>, desired: &NetworkPolicy) -> Option<Drift> {
    let Some(observed) = observed else {
        return Some(Drift::Missing);
    };
    if observed.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let same = normalize(observed.spec.as_ref()) == normalize(desired.spec.as_ref());
    (!same).then_some(Drift::SpecChanged)
}

/// `spec` as the API server stores it: empty lists and absent ones alike, a port's
/// protocol TCP unless given, `policyTypes` derived when not given (Ingress, and Egress
/// when there are egress rules) and in a fixed order.
pub fn normalize(spec: Option<&NetworkPolicySpec>) -> NetworkPolicySpec {
    let spec = spec.cloned().unwrap_or_default();
    let ingress: Vec<_> = spec
        .ingress
        .unwrap_or_default()
        .into_iter()
        .map(|r| NetworkPolicyIngressRule {
            from: Some(peers(r.from)),
            ports: Some(ports(r.ports)),
        })
        .collect();
    let egress: Vec<_> = spec
        .egress
        .unwrap_or_default()
        .into_iter()
        .map(|r| NetworkPolicyEgressRule {
            to: Some(peers(r.to)),
            ports: Some(ports(r.ports)),
        })
        .collect();
    let mut types = spec.policy_types.unwrap_or_default();
    if types.is_empty() {
        types.push("Ingress".into());
        if !egress.is_empty() {
            types.push("Egress".into());
        }
    }
    types.sort();
    types.dedup();
    NetworkPolicySpec {
        pod_selector: Some(selector(spec.pod_selector.unwrap_or_default())),
        policy_types: Some(types),
        ingress: Some(ingress),
        egress: Some(egress),
    }
}

fn selector(s: LabelSelector) -> LabelSelector {
    LabelSelector {
        match_labels: Some(s.match_labels.unwrap_or_default()),
        match_expressions: Some(
            s.match_expressions
                .unwrap_or_default()
                .into_iter()
                .map(|mut e| {
                    e.values = Some(e.values.unwrap_or_default());
                    e
                })
                .collect(),
        ),
    }
}

fn peers(peers: Option<Vec<NetworkPolicyPeer>>) -> Vec<NetworkPolicyPeer> {
    peers
        .unwrap_or_default()
        .into_iter()
        .map(|p| NetworkPolicyPeer {
            // An absent selector and an empty one mean different things here (this
            // namespace / every namespace): only the inside of a given one is normalised.
            pod_selector: p.pod_selector.map(selector),
            namespace_selector: p.namespace_selector.map(selector),
            ip_block: p.ip_block.map(|mut b| {
                b.except = Some(b.except.unwrap_or_default());
                b
            }),
        })
        .collect()
}

fn ports(ports: Option<Vec<NetworkPolicyPort>>) -> Vec<NetworkPolicyPort> {
    ports
        .unwrap_or_default()
        .into_iter()
        .map(|mut p| {
            p.protocol.get_or_insert_with(|| "TCP".into());
            p
        })
        .collect()
}

/// Applies the policy of `namespace` (server-side apply; `force` takes over fields another
/// manager set to other values).
async fn apply(
    api: &Api<NetworkPolicy>,
    namespace: &str,
    force: bool,
) -> Result<NetworkPolicy, Error> {
    let mut pp = PatchParams::apply(FIELD_MANAGER);
    pp.force = force;
    api.patch(
        NETWORK_POLICY_NAME,
        &pp,
        &Patch::Apply(&network_policy(namespace)),
    )
    .await
    .map_err(kube_err(format!(
        "applying NetworkPolicy {namespace}/{NETWORK_POLICY_NAME}"
    )))
}

/// Applies the deny-all NetworkPolicy of sandbox pods in `namespace` (at start-up).
pub async fn ensure(client: &Client, namespace: &str) -> Result<(), Error> {
    apply(
        &Api::namespaced(client.clone(), namespace),
        namespace,
        false,
    )
    .await?;
    Ok(())
}

/// Keeps the policy in place until `stop` (one term of leadership): applies it again
/// whenever the watch shows it deleted or changed ([`drift`]).
pub async fn guard(ctx: std::sync::Arc<Context>, stop: CancellationToken) {
    let ns = ctx.config.namespace.clone();
    let api: Api<NetworkPolicy> = ctx.api();
    let desired = network_policy(&ns);
    let key = ObjectRef::<NetworkPolicy>::new(NETWORK_POLICY_NAME).within(&ns);
    let (reader, writer) = reflector::store();
    let only_it =
        watcher::Config::default().fields(&format!("metadata.name={NETWORK_POLICY_NAME}"));
    let mut watch = watcher(api.clone(), only_it)
        .default_backoff()
        .reflect(writer)
        .boxed();
    // Nothing is decided before the first complete list (the cache would look empty).
    let mut synced = false;
    let mut retry_at: Option<Instant> = None;
    debug!(namespace = %ns, "guarding the deny-all NetworkPolicy");
    loop {
        let retry = async {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = retry => retry_at = None,
            ev = watch.next() => match ev {
                None => break,
                Some(Err(e)) => {
                    debug!(error = %e, "NetworkPolicy watch");
                    continue;
                }
                Some(Ok(watcher::Event::InitDone)) => synced = true,
                // A relist in progress: decide once it is complete.
                Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) => continue,
                Some(Ok(_)) => {}
            },
        }
        if !synced {
            continue;
        }
        let observed = reader.get(&key);
        let Some(why) = drift(observed.as_deref(), &desired) else {
            continue;
        };
        match apply(&api, &ns, true).await {
            Ok(written) => {
                retry_at = None;
                ctx.metrics.network_policy_restored.inc();
                let note = format!("{} restored: {}", NETWORK_POLICY_NAME, why.as_str());
                warn!(namespace = %ns, policy = NETWORK_POLICY_NAME, reason = why.as_str(), "restored the deny-all NetworkPolicy");
                ctx.event(&written, EventType::Warning, "Restored", note)
                    .await;
            }
            Err(e) => {
                warn!(error = %e, retry_in = ?RETRY, "restoring the deny-all NetworkPolicy failed");
                retry_at = Some(Instant::now() + RETRY);
            }
        }
    }
    debug!("stopped guarding the deny-all NetworkPolicy");
}

#[cfg(test)]
mod tests;
