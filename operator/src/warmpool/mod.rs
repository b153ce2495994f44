//! The warm pool: ready sandbox pods whose agent (`toolrun-runner agent`) waits for work,
//! so a one-shot run skips the pod start (about a second on a small node).
//!
//! - `warmPool: {LANGUAGE: SIZE}` in the operator's configuration; the pool keeps SIZE
//!   unclaimed pods per language, made by [`crate::toolrun::builders::agent_pod`] (the same lockdown
//!   as every sandbox pod, a uid of their own, no per-run data anywhere in their spec) and
//!   labelled [`labels::WARM_POOL`]. Pods left from another configuration (their
//!   [`SPEC_HASH`] label differs) are replaced; failed ones are removed.
//! - A ToolRun that [`crate::toolrun::decide::warm_language`] accepts is offered one ready pod
//!   ([`Pool::pick`]); how it binds, claims and runs there is [`crate::toolrun::decide`]'s (the
//!   binding is recorded in its status before anything is sent); the request is carried
//!   by [`runs::AgentRuns`] through the relay. The pod is used once, then deleted; the pool
//!   refills in the background. An empty pool means the cold path: a pod of its own.
//!
//! The pool is kept by the leader only, while it leads. [`plan`] is the pure half: what
//! to create and delete given the pods observed.

pub mod runs;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use toolrun_crd::labels;
use tracing::{debug, info, warn};

use crate::config::OperatorConfig;
use crate::pods::{is_ready_warm_pod, is_terminal};
use crate::toolrun::builders;

/// The pool of warm session pods ([`crate::toolsession::warm_session_pod`]), beside the
/// languages' pools: the value of their [`labels::WARM_POOL`] label (no language name has
/// a dot).
pub const SESSION_POOL: &str = "toolrun.session";

/// Label on warm pods: a hash of the pod spec they were made from, so pods of an older
/// configuration are replaced.
pub const SPEC_HASH: &str = "toolrun.dev/warm-spec";
/// How often the pool is checked besides on every change of its pods.
const TICK: Duration = Duration::from_secs(5);
/// A pod created but not yet seen in the watch cache counts as present this long.
const CREATED_GRACE: Duration = Duration::from_secs(30);
/// A pod offered to a run is not offered again for this long (the run claims it or gives
/// it up well within it).
const RESERVED_FOR: Duration = Duration::from_secs(10);

/// What the pool must do now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Pods to create, per language.
    pub create: BTreeMap<String, u32>,
    /// Unclaimed pods to delete (failed, of another configuration or language, or extra).
    pub delete: Vec<String>,
}

/// Decides what keeps each language's pool at its size: `pods` are the observed pods with
/// the [`labels::WARM_POOL`] label, `hashes` the current spec hash per language,
/// `in_flight` pods created but not yet observed, per language.
pub fn plan(
    pods: &[Arc<Pod>],
    sizes: &BTreeMap<String, u32>,
    hashes: &BTreeMap<String, String>,
    in_flight: &BTreeMap<String, u32>,
) -> Plan {
    let mut plan = Plan::default();
    let mut alive: BTreeMap<&str, Vec<&Pod>> = BTreeMap::new();
    for pod in pods {
        if !pod.owner_references().is_empty() || pod.metadata.deletion_timestamp.is_some() {
            // Claimed (its run deletes it) or already going.
            continue;
        }
        let lang = pod
            .labels()
            .get(labels::WARM_POOL)
            .map(String::as_str)
            .unwrap_or_default();
        let current = hashes
            .get(lang)
            .is_some_and(|h| pod.labels().get(SPEC_HASH).map(String::as_str) == Some(h.as_str()));
        if !current || is_terminal(pod) || sizes.get(lang).copied().unwrap_or(0) == 0 {
            plan.delete.push(pod.name_any());
            continue;
        }
        alive.entry(lang).or_default().push(pod);
    }
    for (lang, &size) in sizes {
        let mut have = alive.remove(lang.as_str()).unwrap_or_default();
        let coming = in_flight.get(lang).copied().unwrap_or(0);
        let count = have.len() as u32 + coming;
        if count < size {
            plan.create.insert(lang.clone(), size - count);
        } else if count > size {
            // Extra pods (the size went down): the ones not ready yet go first.
            have.sort_by_key(|p| (is_ready_warm_pod(p), p.name_any()));
            let extra = ((count - size) as usize).min(have.len());
            plan.delete
                .extend(have.iter().take(extra).map(|p| p.name_any()));
        }
    }
    plan.delete.sort();
    plan
}

/// The pool sizes: each language's of `warmPool`, and [`SESSION_POOL`]'s.
pub fn sizes(config: &OperatorConfig) -> BTreeMap<String, u32> {
    let mut sizes = config.warm_pool.clone();
    if config.session_warm_pool > 0 {
        sizes.insert(SESSION_POOL.to_string(), config.session_warm_pool);
    }
    sizes
}

/// The pod a warm pod of `pool` (a language or [`SESSION_POOL`]) is made from, named
/// `name`, with its labels.
pub fn warm_pod(
    name: &str,
    pool: &str,
    hash: &str,
    config: &OperatorConfig,
) -> Result<Pod, builders::BuildError> {
    let labels = BTreeMap::from([
        (labels::WARM_POOL.to_string(), pool.to_string()),
        (SPEC_HASH.to_string(), hash.to_string()),
    ]);
    if pool == SESSION_POOL {
        return crate::toolsession::warm_session_pod(name, labels, config);
    }
    builders::agent_pod(name, pool, labels, config)
}

/// A hash of everything a warm pod of `pool` is made from (its spec without the
/// name-derived parts), 16 hex digits: a label value.
pub fn spec_hash(pool: &str, config: &OperatorConfig) -> Result<String, builders::BuildError> {
    Ok(pod_spec_hash(&warm_pod("warm", pool, "", config)?))
}

/// A hash of `pod`'s spec without the parts derived from its name (the uid in the
/// security contexts), 16 hex digits.
pub fn pod_spec_hash(pod: &Pod) -> String {
    let mut pod = pod.clone();
    // The uid is derived from the name; everything else is the configuration's.
    if let Some(spec) = pod.spec.as_mut() {
        spec.security_context = None;
        for c in &mut spec.containers {
            c.security_context = None;
        }
        for c in spec.init_containers.iter_mut().flatten() {
            c.security_context = None;
        }
    }
    let json = serde_json::to_vec(&pod.spec).expect("a pod spec serialises");
    blake3::hash(&json).to_hex()[..16].to_string()
}

/// The warm pods this replica knows of, and the runs they were offered to.
#[derive(Default)]
pub struct Pool {
    store: Mutex<Option<Store<Pod>>>,
    reserved: Mutex<HashMap<String, Instant>>,
}

impl Pool {
    /// A ready, unclaimed pod of `language` not offered to another run in the last
    /// [`RESERVED_FOR`]; it is reserved for the caller.
    pub fn pick(&self, language: &str) -> Option<Pod> {
        let store = self
            .store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()?;
        let mut reserved = self.reserved.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        reserved.retain(|_, at| now.duration_since(*at) < RESERVED_FOR);
        let pod = store
            .state()
            .into_iter()
            .filter(|p| {
                p.labels().get(labels::WARM_POOL).map(String::as_str) == Some(language)
                    && is_ready_warm_pod(p)
                    && !reserved.contains_key(&p.name_any())
            })
            .min_by_key(|p| p.name_any())?;
        reserved.insert(pod.name_any(), now);
        Some((*pod).clone())
    }

    /// Ready, unclaimed pods per language (metrics, tests).
    pub fn ready(&self) -> BTreeMap<String, usize> {
        let Some(store) = self.store.lock().unwrap_or_else(|e| e.into_inner()).clone() else {
            return BTreeMap::new();
        };
        let mut out = BTreeMap::new();
        for p in store.state() {
            if is_ready_warm_pod(&p)
                && let Some(lang) = p.labels().get(labels::WARM_POOL)
            {
                *out.entry(lang.clone()).or_insert(0) += 1;
            }
        }
        out
    }

    fn set_store(&self, store: Option<Store<Pod>>) {
        *self.store.lock().unwrap_or_else(|e| e.into_inner()) = store;
    }
}

/// Keeps the pool at its sizes until `stop` (one term of leadership): watches the warm
/// pods, and creates and deletes per [`plan`] on every change and every [`TICK`].
pub async fn keep(
    client: Client,
    config: OperatorConfig,
    pool: Arc<Pool>,
    stop: tokio_util::sync::CancellationToken,
) {
    let sizes = sizes(&config);
    if sizes.values().all(|&n| n == 0) {
        return;
    }
    let pods: Api<Pod> = Api::namespaced(client, &config.namespace);
    let mut hashes = BTreeMap::new();
    for lang in sizes.keys() {
        match spec_hash(lang, &config) {
            Ok(h) => {
                hashes.insert(lang.clone(), h);
            }
            Err(e) => warn!(language = %lang, error = %e, "no warm pool: its pod cannot be built"),
        }
    }
    let (reader, writer) = reflector::store();
    let mut watch = watcher(
        pods.clone(),
        watcher::Config::default().labels(labels::WARM_POOL),
    )
    .default_backoff()
    .reflect(writer)
    .boxed();
    pool.set_store(Some(reader.clone()));
    let mut created: HashMap<String, (String, Instant)> = HashMap::new();
    let mut tick = tokio::time::interval(TICK);
    // Nothing is planned before the first complete list (the cache would look empty).
    let mut synced = false;
    info!(?sizes, "keeping the warm pool");
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
            ev = watch.next() => match ev {
                None => break,
                Some(Err(e)) => { debug!(error = %e, "warm pod watch"); continue; }
                Some(Ok(watcher::Event::InitDone)) => synced = true,
                Some(Ok(_)) => {}
            },
        }
        if !synced {
            continue;
        }
        let state = reader.state();
        let now = Instant::now();
        created.retain(|name, (_, at)| {
            now.duration_since(*at) < CREATED_GRACE && !state.iter().any(|p| p.name_any() == *name)
        });
        let mut in_flight = BTreeMap::new();
        for (lang, _) in created.values() {
            *in_flight.entry(lang.clone()).or_insert(0u32) += 1;
        }
        let plan = plan(&state, &sizes, &hashes, &in_flight);
        for name in &plan.delete {
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            };
            match pods.delete(name, &dp).await {
                Ok(_) => info!(pod = %name, "deleted a warm pod"),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => warn!(pod = %name, error = %e, "deleting a warm pod failed"),
            }
        }
        for (lang, n) in &plan.create {
            let Some(hash) = hashes.get(lang) else {
                continue;
            };
            for _ in 0..*n {
                let kind = if lang == SESSION_POOL {
                    "session"
                } else {
                    lang
                };
                let name = format!("warm-{kind}-{}", random_suffix());
                let pod = match warm_pod(&name, lang, hash, &config) {
                    Ok(p) => p,
                    Err(e) => {
                        warn!(language = %lang, error = %e, "building a warm pod failed");
                        break;
                    }
                };
                let pp = PostParams {
                    field_manager: Some(crate::reconcile::FIELD_MANAGER.into()),
                    ..PostParams::default()
                };
                match pods.create(&pp, &pod).await {
                    Ok(_) => {
                        debug!(pod = %name, "created a warm pod");
                        created.insert(name, (lang.clone(), Instant::now()));
                    }
                    Err(e) => {
                        warn!(language = %lang, error = %e, "creating a warm pod failed");
                        break;
                    }
                }
            }
        }
    }
    pool.set_store(None);
}

/// 10 lowercase hex digits, unique enough for pod names made by one operator.
fn random_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let seed = format!("{t}-{n}-{}", std::process::id());
    blake3::hash(seed.as_bytes()).to_hex()[..10].to_string()
}

#[cfg(test)]
mod tests;
