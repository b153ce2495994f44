//! Prometheus metrics served on the admin port's `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of a finished call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// Tool id (or the unknown name asked for).
    pub tool: String,
    /// `OK` or the error code.
    pub code: String,
}

/// Labels by tool.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolLabels {
    /// Tool id.
    pub tool: String,
}

/// Labels of a finished sandbox run.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabels {
    /// Runner verdict, e.g. `OK`, `TIMEOUT`.
    pub verdict: String,
}

/// Every metric the gateway exports.
pub struct Metrics {
    registry: Registry,
    /// Calls by tool and result code.
    pub calls: Family<CallLabels, Counter>,
    /// Call latency by tool, seconds.
    pub latency: Family<ToolLabels, Histogram>,
    /// Sandbox runs by verdict.
    pub sandbox_runs: Family<VerdictLabels, Counter>,
    /// Sandbox runs executing now.
    pub sandbox_inflight: Gauge,
    /// Sandbox runs waiting for a slot.
    pub sandbox_queued: Gauge,
    /// Kubernetes backend: times the shared ToolRun watch failed and was re-established.
    pub kube_watch_restarts: Counter,
    /// Kubernetes backend: ToolRuns created and not yet finished.
    pub kube_inflight_runs: Gauge,
    /// Sessions open (set when scraped).
    pub sessions_open: Gauge,
    /// Calls waiting for an approval (set when scraped).
    pub approvals_pending: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("toolrun");
        let calls = Family::<CallLabels, Counter>::default();
        registry.register("calls", "Tool calls by tool and result code", calls.clone());
        // 10 us .. ~80 s: inline tools sit at the low end, sandbox runs at the high end.
        let latency = Family::<ToolLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.00001, 2.0, 24,
            ))
        });
        registry.register(
            "call_duration_seconds",
            "Tool call latency by tool",
            latency.clone(),
        );
        let sandbox_runs = Family::<VerdictLabels, Counter>::default();
        registry.register(
            "sandbox_runs",
            "Sandbox runs by verdict",
            sandbox_runs.clone(),
        );
        let sandbox_inflight = Gauge::default();
        registry.register(
            "sandbox_inflight",
            "Sandbox runs executing now",
            sandbox_inflight.clone(),
        );
        let sandbox_queued = Gauge::default();
        registry.register(
            "sandbox_queue_depth",
            "Sandbox runs waiting for a free slot",
            sandbox_queued.clone(),
        );
        let kube_watch_restarts = Counter::default();
        registry.register(
            "kube_watch_restarts",
            "Times the kubernetes backend's shared ToolRun watch failed and was re-established",
            kube_watch_restarts.clone(),
        );
        let kube_inflight_runs = Gauge::default();
        registry.register(
            "kube_inflight_runs",
            "ToolRuns created by the kubernetes backend and not yet finished",
            kube_inflight_runs.clone(),
        );
        let sessions_open = Gauge::default();
        registry.register("sessions_open", "Sessions open", sessions_open.clone());
        let approvals_pending = Gauge::default();
        registry.register(
            "approvals_pending",
            "Calls waiting for an approval",
            approvals_pending.clone(),
        );
        Metrics {
            registry,
            sessions_open,
            approvals_pending,
            kube_watch_restarts,
            kube_inflight_runs,
            calls,
            latency,
            sandbox_runs,
            sandbox_inflight,
            sandbox_queued,
        }
    }

    /// Text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}
