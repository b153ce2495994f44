//! Custom tools declared as `Tool` resources (the kubernetes backend): one watch over the
//! sandbox namespace's Tools; each change of a spec re-declares the set
//! ([`CustomTools::set`], which swaps the registry) and each Tool's verdict is written into
//! its status: condition `Ready` True (reason `Loaded`) or False (reason `Invalid`, the
//! message says why). Turning a Tool into a declaration and a verdict into a status are
//! pure functions ([`to_spec`], [`ready_condition`]); the task only fetches and patches.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use toolrun_crd::Tool;
use toolrun_crd::tool::{READY, REASON_INVALID, REASON_LOADED};

use super::custom::{CustomToolSpec, Implementation};
use super::custom_reload::{CustomTools, Declared, Source, ToolState};
use crate::config::LimitsOverride;
use crate::tool::Hints;

/// The declaration a Tool makes.
pub fn to_spec(t: &Tool) -> CustomToolSpec {
    let s = &t.spec;
    let i = &s.implementation;
    CustomToolSpec {
        name: t.tool_name().to_string(),
        title: s.title.clone(),
        description: s.description.clone(),
        input_schema: s.input_schema.clone(),
        output_schema: s.output_schema.clone(),
        annotations: Hints {
            read_only: s.annotations.read_only,
            destructive: s.annotations.destructive,
            idempotent: s.annotations.idempotent,
            open_world: s.annotations.open_world,
        },
        category: None,
        timeout_ms: s.timeout_ms,
        limits: s.limits.as_ref().map(|l| LimitsOverride {
            memory_mb: l.memory_mib,
            cpu_seconds: l.cpu_seconds,
            max_processes: l.processes,
            output_limit_bytes: l.output_bytes,
            ..LimitsOverride::default()
        }),
        implementation: Implementation {
            language: i.language.clone(),
            script: i.script.clone(),
            script_file: None,
            image: i.image.clone(),
            command: i.command.clone().unwrap_or_default(),
        },
    }
}

/// The `Ready` condition for a verdict; the transition time is kept while the status does
/// not change. `None` when `previous` already says the same (nothing to write).
pub fn ready_condition(
    state: &ToolState,
    generation: Option<i64>,
    previous: Option<&Condition>,
    now: Time,
) -> Option<Condition> {
    let (status, reason, message) = match &state.reason {
        None => ("True", REASON_LOADED, "served by the gateway".to_string()),
        // The API server bounds a condition's message at 32768 characters.
        Some(why) => ("False", REASON_INVALID, why.chars().take(4000).collect()),
    };
    let same_status = previous.is_some_and(|p| p.status == status);
    if same_status
        && previous.is_some_and(|p| {
            p.reason == reason && p.message == message && p.observed_generation == generation
        })
    {
        return None;
    }
    Some(Condition {
        type_: READY.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: match previous {
            Some(p) if same_status => p.last_transition_time.clone(),
            _ => now,
        },
    })
}

/// Follows the Tools of `namespace` until `stop`: declares them as custom tools and writes
/// each one's verdict. Watch errors are retried with backoff and shown in `/readyz`.
pub fn follow(
    client: kube::Client,
    namespace: String,
    custom: Arc<CustomTools>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let api: Api<Tool> = Api::namespaced(client, &namespace);
    tokio::spawn(async move {
        // By object name; `listing` collects a (re)list until it is complete.
        let mut tools: BTreeMap<String, Tool> = BTreeMap::new();
        let mut listing: Option<BTreeMap<String, Tool>> = None;
        let events = watcher(api.clone(), watcher::Config::default()).default_backoff();
        futures::pin_mut!(events);
        loop {
            let event = tokio::select! {
                e = events.next() => e,
                _ = stop.cancelled() => return,
            };
            let Some(event) = event else { return };
            let key = |t: &Tool| t.metadata.name.clone().unwrap_or_default();
            let changed = match event {
                Ok(watcher::Event::Init) => {
                    listing = Some(BTreeMap::new());
                    false
                }
                Ok(watcher::Event::InitApply(t)) => {
                    listing.get_or_insert_default().insert(key(&t), t);
                    false
                }
                Ok(watcher::Event::InitDone) => {
                    tools = listing.take().unwrap_or_default();
                    true
                }
                Ok(watcher::Event::Apply(t)) => {
                    // Our own status patches come back as events: only a new spec re-declares.
                    let new_spec = tools.get(&key(&t)).is_none_or(|old| {
                        old.spec != t.spec || old.metadata.generation != t.metadata.generation
                    });
                    tools.insert(key(&t), t);
                    new_spec
                }
                Ok(watcher::Event::Delete(t)) => tools.remove(&key(&t)).is_some(),
                Err(e) => {
                    custom.source_error(
                        Source::Kubernetes,
                        format!("watching Tools in namespace {namespace}: {e}"),
                    );
                    false
                }
            };
            if !changed {
                continue;
            }
            let declared = tools
                .values()
                .map(|t| Declared {
                    name: t.tool_name().to_string(),
                    spec: Ok(to_spec(t)),
                    base_dir: None,
                })
                .collect();
            let states = custom.set(Source::Kubernetes, declared);
            for (t, state) in tools.values().zip(&states) {
                write_status(&api, t, state).await;
            }
        }
    })
}

async fn write_status(api: &Api<Tool>, t: &Tool, state: &ToolState) {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let Some(condition) = ready_condition(state, t.metadata.generation, t.ready(), now) else {
        return;
    };
    let name = t.metadata.name.clone().unwrap_or_default();
    let patch = json!({"status": {
        "conditions": [condition],
        "observedGeneration": t.metadata.generation,
    }});
    if let Err(e) = api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        tracing::warn!(tool = %name, "cannot write the Tool's status: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(spec: serde_json::Value) -> Tool {
        serde_json::from_value(json!({
            "apiVersion": "toolrun.dev/v1alpha1",
            "kind": "Tool",
            "metadata": {"name": "word-count", "namespace": "ns", "generation": 3},
            "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn a_tool_declares_what_the_config_file_would() {
        let t = tool(json!({
            "name": "word_count",
            "description": "Counts words.",
            "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
            "annotations": {"destructive": true, "openWorld": true},
            "timeoutMs": 2000,
            "limits": {"memoryMiB": 64, "processes": 8},
            "implementation": {"language": "javascript", "script": "console.log('{}')"},
        }));
        let s = to_spec(&t);
        assert_eq!(s.name, "word_count");
        assert!(s.annotations.destructive && s.annotations.open_world);
        assert!(!s.annotations.read_only);
        assert_eq!(s.timeout_ms, Some(2000));
        let l = s.limits.unwrap();
        assert_eq!((l.memory_mb, l.max_processes), (Some(64), Some(8)));
        assert_eq!(s.implementation.language.as_deref(), Some("javascript"));
        let t = tool(json!({
            "description": "d",
            "inputSchema": {"type": "object", "properties": {}},
            "implementation": {"image": "wc:1", "command": ["/wc"]},
        }));
        let s = to_spec(&t);
        assert_eq!(s.name, "word-count");
        assert_eq!(s.implementation.image.as_deref(), Some("wc:1"));
        assert_eq!(s.implementation.command, ["/wc"]);
    }

    #[test]
    fn the_condition_follows_the_verdict_and_is_written_once() {
        let t0 = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let t1 = Time(k8s_openapi::jiff::Timestamp::now());
        let ok = ToolState {
            name: "t".into(),
            source: Source::Kubernetes,
            ready: true,
            reason: None,
        };
        let bad = ToolState {
            ready: false,
            reason: Some("implementation.image: \"busybox:1.36\" is not allowed".into()),
            ..ok.clone()
        };
        let c = ready_condition(&ok, Some(1), None, t0.clone()).unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Loaded"));
        // Unchanged: nothing to write (our own patch's event does not loop).
        assert!(ready_condition(&ok, Some(1), Some(&c), t1.clone()).is_none());
        // A new generation, still ready: written, transition time kept.
        let c2 = ready_condition(&ok, Some(2), Some(&c), t1.clone()).unwrap();
        assert_eq!(c2.last_transition_time, t0);
        assert_eq!(c2.observed_generation, Some(2));
        // Refused: False, Invalid, the reason as message, a new transition time.
        let c3 = ready_condition(&bad, Some(3), Some(&c2), t1.clone()).unwrap();
        assert_eq!(
            (c3.status.as_str(), c3.reason.as_str()),
            ("False", "Invalid")
        );
        assert!(c3.message.contains("is not allowed"));
        assert_eq!(c3.last_transition_time, t1);
    }
}
