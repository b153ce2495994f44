//! What a sandbox pod shows, read the same way by every kind: pure.
//!
//! Tested through the decisions that read them ([`crate::toolrun::decide`],
//! [`crate::toolsession::decide`], [`crate::warmpool::plan`]).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::toolrun::builders;

/// Waiting reasons of a container whose image cannot be had.
const IMAGE_REASONS: &[&str] = &["ErrImagePull", "ImagePullBackOff", "InvalidImageName"];
/// Waiting reasons of a container that cannot be created as specified.
const CONFIG_REASONS: &[&str] = &["CreateContainerConfigError", "CreateContainerError"];

/// A pod of the warm pool (claimed or not).
pub fn is_warm_pod(pod: &Pod) -> bool {
    pod.labels().contains_key(toolrun_crd::labels::WARM_POOL)
}

/// A warm pod ready for a run: unclaimed, not going away, running its agent.
pub fn is_ready_warm_pod(pod: &Pod) -> bool {
    is_warm_pod(pod)
        && pod.owner_references().is_empty()
        && pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && agent_running(pod)
}

/// The pod's agent container is running (a warm or session pod ready for requests).
pub fn agent_running(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .any(|c| {
            c.name == builders::AGENT_CONTAINER
                && c.state.as_ref().is_some_and(|s| s.running.is_some())
        })
}

/// The pod's phase is Succeeded or Failed.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Why a pending pod will not start by itself (image, container config, no node).
pub fn pending_problem(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let unschedulable = status.conditions.iter().flatten().find(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    });
    if let Some(c) = unschedulable {
        return Some(format!(
            "unschedulable: {}",
            c.message.as_deref().unwrap_or("no node fits the pod")
        ));
    }
    let spec = pod.spec.as_ref();
    let image_of = |name: &str| {
        spec.into_iter()
            .flat_map(|s| {
                s.init_containers
                    .iter()
                    .flatten()
                    .chain(s.containers.iter())
            })
            .find(|c| c.name == name)
            .and_then(|c| c.image.clone())
            .unwrap_or_default()
    };
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    for c in containers {
        let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) else {
            continue;
        };
        let reason = w.reason.as_deref().unwrap_or("");
        let message = w.message.as_deref().unwrap_or("");
        if IMAGE_REASONS.contains(&reason) {
            let image = if c.image.is_empty() {
                image_of(&c.name)
            } else {
                c.image.clone()
            };
            return Some(format!(
                "image not found: {image} (container {}, {reason}: {message})",
                c.name
            ));
        }
        if CONFIG_REASONS.contains(&reason) {
            return Some(format!(
                "container {} cannot be created ({reason}: {message})",
                c.name
            ));
        }
    }
    None
}

/// Time from `since` to `now` (zero when unknown or in the future).
pub fn elapsed(since: Option<&Time>, now: Timestamp) -> Duration {
    let Some(t) = since else {
        return Duration::ZERO;
    };
    let ms = now.as_millisecond() - t.0.as_millisecond();
    Duration::from_millis(ms.max(0).unsigned_abs())
}
