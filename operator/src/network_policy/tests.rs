use super::*;

/// The policy as the API server returns it after the chart and the operator applied it:
/// empty rule lists dropped, server-set metadata, the chart's labels, managed fields.
fn as_stored() -> NetworkPolicy {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": NETWORK_POLICY_NAME,
            "namespace": "toolrun-sandbox",
            "uid": "0b1e4c4e-3f0c-4d55-9d1e-1f2a3b4c5d6e",
            "resourceVersion": "123456",
            "generation": 3,
            "creationTimestamp": "2026-11-24T10:00:00Z",
            "labels": {
                "app.kubernetes.io/managed-by": "Helm",
                "app.kubernetes.io/part-of": "toolrun",
            },
            "annotations": {"meta.helm.sh/release-name": "toolrun"},
            "managedFields": [{
                "manager": "toolrun-operator",
                "operation": "Apply",
                "apiVersion": "networking.k8s.io/v1",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:policyTypes": {}}},
            }],
        },
        "spec": {
            "podSelector": {"matchLabels": {"toolrun.dev/sandbox": "true"}},
            "policyTypes": ["Ingress", "Egress"],
        },
    }))
    .expect("a NetworkPolicy")
}

fn desired() -> NetworkPolicy {
    network_policy("toolrun-sandbox")
}

fn with_spec(edit: impl FnOnce(&mut NetworkPolicySpec)) -> NetworkPolicy {
    let mut np = as_stored();
    edit(np.spec.as_mut().expect("spec"));
    np
}

#[test]
fn a_deleted_policy_is_applied() {
    assert_eq!(drift(None, &desired()), Some(Drift::Missing));
}

#[test]
fn the_same_spec_with_server_set_metadata_is_left_alone() {
    assert_eq!(drift(Some(&as_stored()), &desired()), None);
    // Also exactly as built (empty rule lists present), and with the types in another order.
    assert_eq!(drift(Some(&desired()), &desired()), None);
    let reordered = with_spec(|s| s.policy_types = Some(vec!["Egress".into(), "Ingress".into()]));
    assert_eq!(drift(Some(&reordered), &desired()), None);
    // Being deleted: its deletion comes next, and is restored then.
    let mut going = as_stored();
    going.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2026-11-24T11:00:00Z".parse().unwrap(),
    ));
    assert_eq!(drift(Some(&going), &desired()), None);
}

#[test]
fn a_changed_spec_is_applied() {
    let allow_all_in = with_spec(|s| s.ingress = Some(vec![NetworkPolicyIngressRule::default()]));
    let allow_all_out = with_spec(|s| s.egress = Some(vec![NetworkPolicyEgressRule::default()]));
    let ingress_only = with_spec(|s| s.policy_types = Some(vec!["Ingress".into()]));
    let other_pods = with_spec(|s| {
        s.pod_selector = Some(LabelSelector {
            match_labels: Some([("app".to_string(), "none".to_string())].into()),
            match_expressions: None,
        })
    });
    let no_spec = {
        let mut np = as_stored();
        np.spec = None;
        np
    };
    for (what, np) in [
        ("an allow-all ingress rule", allow_all_in),
        ("an allow-all egress rule", allow_all_out),
        ("egress no longer governed", ingress_only),
        ("another pod selector", other_pods),
        ("no spec", no_spec),
    ] {
        assert_eq!(
            drift(Some(&np), &desired()),
            Some(Drift::SpecChanged),
            "{what}"
        );
    }
}

#[test]
fn normalising_applies_the_servers_defaults_only() {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let port = |protocol: Option<&str>| NetworkPolicyPort {
        port: Some(IntOrString::Int(53)),
        protocol: protocol.map(String::from),
        end_port: None,
    };
    let rule = |protocol| NetworkPolicyEgressRule {
        ports: Some(vec![port(protocol)]),
        to: None,
    };
    let spec = |protocol, types: Option<Vec<String>>| NetworkPolicySpec {
        egress: Some(vec![rule(protocol)]),
        policy_types: types,
        ..NetworkPolicySpec::default()
    };
    // A port's protocol defaults to TCP; policyTypes to Ingress plus Egress with egress rules.
    assert_eq!(
        normalize(Some(&spec(None, None))),
        normalize(Some(&spec(
            Some("TCP"),
            Some(vec!["Ingress".into(), "Egress".into()])
        )))
    );
    assert_ne!(
        normalize(Some(&spec(Some("UDP"), None))),
        normalize(Some(&spec(None, None)))
    );
    // An absent namespace selector (this namespace) is not an empty one (every namespace).
    let to = |ns: Option<LabelSelector>| NetworkPolicySpec {
        egress: Some(vec![NetworkPolicyEgressRule {
            to: Some(vec![NetworkPolicyPeer {
                namespace_selector: ns,
                ..NetworkPolicyPeer::default()
            }]),
            ports: None,
        }]),
        ..NetworkPolicySpec::default()
    };
    assert_ne!(
        normalize(Some(&to(None))),
        normalize(Some(&to(Some(LabelSelector::default()))))
    );
}

/// A fake API server for the guard: lists the policy `listed`, streams the watch events
/// sent on the returned channel, and records each apply (PATCH) it receives.
mod fake_api {
    use std::convert::Infallible;
    use std::sync::{Arc, Mutex};

    use axum::Router;
    use axum::body::Body;
    use axum::extract::{RawQuery, State};
    use axum::http::StatusCode;
    use axum::routing::get;
    use futures::StreamExt;
    use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};

    use super::*;

    /// One PATCH received: its query string and body.
    pub type Applied = Arc<Mutex<Vec<(String, serde_json::Value)>>>;

    #[derive(Clone)]
    struct Fake {
        listed: Option<NetworkPolicy>,
        watch: Arc<Mutex<Option<UnboundedReceiver<String>>>>,
        applied: Applied,
    }

    async fn list_or_watch(State(f): State<Fake>, RawQuery(q): RawQuery) -> (StatusCode, Body) {
        if q.unwrap_or_default().contains("watch=true") {
            // The first watch gets the events; a later one (a re-watch) hangs.
            let events = f.watch.lock().unwrap().take();
            let body = match events {
                Some(rx) => Body::from_stream(rx.map(|line| Ok::<_, Infallible>(line + "\n"))),
                None => Body::from_stream(futures::stream::pending::<Result<String, Infallible>>()),
            };
            return (StatusCode::OK, body);
        }
        let list = serde_json::json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicyList",
            "metadata": {"resourceVersion": "1"},
            "items": f.listed.iter().collect::<Vec<_>>(),
        });
        (StatusCode::OK, Body::from(list.to_string()))
    }

    async fn apply(
        State(f): State<Fake>,
        RawQuery(q): RawQuery,
        body: String,
    ) -> (StatusCode, String) {
        let body: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        f.applied
            .lock()
            .unwrap()
            .push((q.unwrap_or_default(), body.clone()));
        let mut written = body;
        written["metadata"]["uid"] = "u-1".into();
        written["metadata"]["resourceVersion"] = "2".into();
        (StatusCode::OK, written.to_string())
    }

    /// Serves the fake on localhost: a client for it, the watch events' sender and the
    /// applies received.
    pub async fn serve(
        listed: Option<NetworkPolicy>,
    ) -> (kube::Client, UnboundedSender<String>, Applied) {
        let (tx, rx) = unbounded();
        let applied = Applied::default();
        let fake = Fake {
            listed,
            watch: Arc::new(Mutex::new(Some(rx))),
            applied: applied.clone(),
        };
        let base = "/apis/networking.k8s.io/v1/namespaces/toolrun-sandbox/networkpolicies";
        let app = Router::new()
            .route(base, get(list_or_watch))
            .route(
                &format!("{base}/{NETWORK_POLICY_NAME}"),
                axum::routing::patch(apply),
            )
            .with_state(fake);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(axum::serve(listener, app).into_future());
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        (kube::Client::try_from(config).unwrap(), tx, applied)
    }
}

fn watch_event(type_: &str, np: &NetworkPolicy) -> String {
    serde_json::json!({"type": type_, "object": np}).to_string()
}

async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn the_guard_restores_a_deleted_or_changed_policy_and_nothing_else() {
    let (client, events, applied) = fake_api::serve(Some(as_stored())).await;
    let config = crate::OperatorConfig {
        namespace: "toolrun-sandbox".into(),
        ..crate::OperatorConfig::default()
    };
    let metrics = std::sync::Arc::new(crate::metrics::Metrics::new());
    let ctx = std::sync::Arc::new(Context::new(
        client,
        config,
        &crate::ControllerConfig::default(),
        "test".into(),
        metrics.clone(),
    ));
    let stop = CancellationToken::new();
    let guard = tokio::spawn(guard(ctx, stop.clone()));
    let restored = || metrics.network_policy_restored.get();
    let applies = || applied.lock().unwrap().len();

    // Control: the listed policy is the desired one (with the server's metadata), and a
    // change of its labels only is no drift either.
    let mut relabelled = as_stored();
    relabelled.metadata.labels = Some([("someone".to_string(), "else".to_string())].into());
    events
        .unbounded_send(watch_event("MODIFIED", &relabelled))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!((applies(), restored()), (0, 0), "nothing to restore");

    events
        .unbounded_send(watch_event("DELETED", &as_stored()))
        .unwrap();
    until("the deleted policy applied again", || applies() == 1).await;
    let (query, body) = applied.lock().unwrap()[0].clone();
    assert!(query.contains("fieldManager=toolrun-operator"), "{query}");
    assert!(query.contains("force=true"), "{query}");
    assert_eq!(
        serde_json::from_value::<NetworkPolicy>(body).unwrap().spec,
        desired().spec
    );
    until("counted", || restored() == 1).await;

    let opened = with_spec(|s| s.ingress = Some(vec![NetworkPolicyIngressRule::default()]));
    events
        .unbounded_send(watch_event("MODIFIED", &opened))
        .unwrap();
    until("the changed policy applied again", || applies() == 2).await;
    until("counted", || restored() == 2).await;

    // The operator's own write coming back through the watch: nothing more.
    events
        .unbounded_send(watch_event("MODIFIED", &as_stored()))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!((applies(), restored()), (2, 2));

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), guard)
        .await
        .expect("the guard stops with its term")
        .unwrap();
}
