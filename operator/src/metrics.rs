//! The operator's Prometheus metrics and its admin HTTP port (`/metrics`, `/healthz`,
//! `/readyz`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label of a reconcile's outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok` or `error`.
    pub result: String,
}

/// Label of a finished run.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabels {
    /// The verdict, e.g. `OK`, `TIMEOUT`.
    pub verdict: String,
}

/// Every metric the operator exports.
pub struct Metrics {
    registry: Registry,
    /// `toolrun_operator_reconciles_total{result}`.
    pub reconciles: Family<ResultLabels, Counter>,
    /// `toolrun_operator_runs_total{verdict}`: results recorded.
    pub runs: Family<VerdictLabels, Counter>,
    /// `toolrun_operator_start_seconds`: ToolRun creation -> pod running.
    pub start_seconds: Histogram,
    /// `toolrun_operator_completion_seconds`: ToolRun creation -> result recorded.
    pub completion_seconds: Histogram,
    /// `toolrun_operator_leader`: 1 while this replica reconciles.
    pub leader: Gauge,
    /// `toolrun_operator_warm_bound_total`: runs bound to a warm pod.
    pub warm_bound: Counter,
    /// `toolrun_operator_warm_unbound_total`: bindings given up (pod taken, gone, not
    /// ready) before anything was sent: those runs got a pod of their own.
    pub warm_unbound: Counter,
    /// `toolrun_operator_network_policy_restored_total`: the sandbox namespace's deny-all
    /// NetworkPolicy applied again after it was deleted or changed.
    pub network_policy_restored: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("toolrun_operator");
        let reconciles = Family::<ResultLabels, Counter>::default();
        registry.register("reconciles", "Reconciles by result", reconciles.clone());
        let runs = Family::<VerdictLabels, Counter>::default();
        registry.register("runs", "Results recorded, by verdict", runs.clone());
        // 50 ms .. ~27 min: a warm pod starts in about a second; runs may last minutes.
        let start_seconds = Histogram::new(exponential_buckets(0.05, 2.0, 16));
        registry.register(
            "start_seconds",
            "Seconds from ToolRun creation to its pod running",
            start_seconds.clone(),
        );
        let completion_seconds = Histogram::new(exponential_buckets(0.05, 2.0, 16));
        registry.register(
            "completion_seconds",
            "Seconds from ToolRun creation to its result recorded",
            completion_seconds.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the lease and reconciles",
            leader.clone(),
        );
        let warm_bound = Counter::default();
        registry.register("warm_bound", "Runs bound to a warm pod", warm_bound.clone());
        let warm_unbound = Counter::default();
        registry.register(
            "warm_unbound",
            "Warm bindings given up before the run was sent (the run got a cold pod)",
            warm_unbound.clone(),
        );
        let network_policy_restored = Counter::default();
        registry.register(
            "network_policy_restored",
            "The sandbox namespace's deny-all NetworkPolicy applied again after it was deleted or changed",
            network_policy_restored.clone(),
        );
        Metrics {
            network_policy_restored,
            warm_bound,
            warm_unbound,
            registry,
            reconciles,
            runs,
            start_seconds,
            completion_seconds,
            leader,
        }
    }

    /// Counts one reconcile.
    pub fn reconciled(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.reconciles
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// What the admin endpoints report.
pub struct AdminState {
    /// Set once the operator is set up (leader or not); cleared at shutdown.
    pub ready: AtomicBool,
    /// Metrics to expose.
    pub metrics: Arc<Metrics>,
}

/// The admin router: `/healthz` (alive), `/readyz` (set up), `/metrics`.
pub fn router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn readyz(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    if s.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn metrics(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contract_names_are_exported() {
        let m = Metrics::new();
        m.reconciled(true);
        m.reconciled(false);
        m.runs
            .get_or_create(&VerdictLabels {
                verdict: "OK".into(),
            })
            .inc();
        m.start_seconds.observe(1.5);
        m.completion_seconds.observe(2.5);
        m.leader.set(1);
        m.network_policy_restored.inc();
        let text = m.encode();
        for line in [
            "toolrun_operator_reconciles_total{result=\"ok\"} 1",
            "toolrun_operator_reconciles_total{result=\"error\"} 1",
            "toolrun_operator_runs_total{verdict=\"OK\"} 1",
            "toolrun_operator_start_seconds_count 1",
            "toolrun_operator_completion_seconds_count 1",
            "toolrun_operator_leader 1",
            "toolrun_operator_network_policy_restored_total 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
