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
