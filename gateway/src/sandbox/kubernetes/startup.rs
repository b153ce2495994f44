//! What the kubernetes backend checks before the gateway serves: the API server answers,
//! the ToolRun CRD is installed, the gateway may do what it needs, the namespace exists.
//! Each failure names what is missing.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use toolrun_crd::ToolRun;

/// Why the kubernetes backend cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// No in-cluster service account and no usable kubeconfig.
    #[error("no Kubernetes client configuration (in-cluster service account or KUBECONFIG): {0}")]
    NoClient(String),
    /// The API server did not answer.
    #[error("cannot reach the Kubernetes API server: {0}")]
    Unreachable(String),
    /// The CRD is not installed.
    #[error(
        "the ToolRun CRD ({plural}.{api_version}) is not installed on the cluster: apply \
         deploy/crds/toolrun.dev_toolruns.yaml or install the toolrun Helm chart"
    )]
    CrdMissing {
        /// Group/version asked for.
        api_version: String,
        /// Resource asked for.
        plural: String,
    },
    /// The namespace does not exist.
    #[error(
        "namespace {0:?} does not exist: create it (the Helm chart does), or choose another \
         with --namespace or sandbox.kubernetes.namespace"
    )]
    NamespaceMissing(String),
    /// RBAC forbids something the backend needs.
    #[error(
        "RBAC: the gateway's identity may not {} in namespace {namespace:?}; it needs \
         toolruns: create get list watch patch delete, pods: get list watch, pods/log: get",
        missing.join(", ")
    )]
    Forbidden {
        /// The namespace.
        namespace: String,
        /// `verb resource` pairs refused.
        missing: Vec<String>,
    },
    /// The API server refused the probe ToolRun for another reason.
    #[error("the API server refused a dry-run ToolRun in namespace {namespace:?}: {message}")]
    Probe {
        /// The namespace.
        namespace: String,
        /// Its answer.
        message: String,
    },
    /// The shared watch did not complete its first list.
    #[error("the ToolRun watch in namespace {namespace:?} did not start: {message}")]
    Watch {
        /// The namespace.
        namespace: String,
        /// Why.
        message: String,
    },
}

/// What the backend does, as `(verb, group, resource, subresource)`.
pub const REQUIRED_ACCESS: [(&str, &str, &str, &str); 10] = [
    ("create", "toolrun.dev", "toolruns", ""),
    ("get", "toolrun.dev", "toolruns", ""),
    ("list", "toolrun.dev", "toolruns", ""),
    ("watch", "toolrun.dev", "toolruns", ""),
    ("patch", "toolrun.dev", "toolruns", ""),
    ("delete", "toolrun.dev", "toolruns", ""),
    ("get", "", "pods", ""),
    ("list", "", "pods", ""),
    ("watch", "", "pods", ""),
    ("get", "", "pods", "log"),
];

/// A client from the environment (in-cluster, or KUBECONFIG / ~/.kube/config).
pub async fn client() -> Result<Client, StartError> {
    Client::try_default()
        .await
        .map_err(|e| StartError::NoClient(e.to_string()))
}

/// Fails unless `api_version` (e.g. `toolrun.dev/v1alpha1`) serves `plural`.
pub async fn check_crd(client: &Client, api_version: &str, plural: &str) -> Result<(), StartError> {
    let missing = || StartError::CrdMissing {
        api_version: api_version.to_string(),
        plural: plural.to_string(),
    };
    match client.list_api_group_resources(api_version).await {
        Ok(list) if list.resources.iter().any(|r| r.name == plural) => Ok(()),
        Ok(_) => Err(missing()),
        // An unserved group/version is a plain "404 page not found", not a Status.
        Err(kube::Error::Api(s)) if s.code == 404 => Err(missing()),
        Err(e) => Err(StartError::Unreachable(e.to_string())),
    }
}

/// Fails naming every access in [`REQUIRED_ACCESS`] that RBAC refuses in `namespace`.
/// When the API server refuses the review itself, the check is skipped (the probe and the
/// watch still fail clearly).
pub async fn check_access(client: &Client, namespace: &str) -> Result<(), StartError> {
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut missing = Vec::new();
    for (verb, group, resource, sub) in REQUIRED_ACCESS {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(namespace.to_string()),
                    verb: Some(verb.to_string()),
                    group: Some(group.to_string()),
                    resource: Some(resource.to_string()),
                    subresource: (!sub.is_empty()).then(|| sub.to_string()),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        match reviews.create(&PostParams::default(), &review).await {
            Ok(r) if r.status.as_ref().is_some_and(|s| s.allowed) => {}
            Ok(_) => {
                let what = if sub.is_empty() {
                    resource.to_string()
                } else {
                    format!("{resource}/{sub}")
                };
                missing.push(format!("{verb} {what}"));
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot review the gateway's own access; skipping the RBAC check");
                return Ok(());
            }
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(StartError::Forbidden {
            namespace: namespace.to_string(),
            missing,
        })
    }
}

/// Creates `probe` with `dryRun=All`: proves the namespace exists and the API server
/// accepts the gateway's ToolRuns (schema and CEL), without creating anything.
pub async fn check_namespace(api: &Api<ToolRun>, probe: &ToolRun) -> Result<(), StartError> {
    let namespace = probe.namespace().unwrap_or_default();
    let pp = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match api.create(&pp, probe).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s))
            if s.is_not_found()
                && (s.details.as_ref().is_some_and(|d| d.kind == "namespaces")
                    || s.message.contains("namespaces")) =>
        {
            Err(StartError::NamespaceMissing(namespace))
        }
        Err(kube::Error::Api(s)) if s.is_forbidden() => Err(StartError::Forbidden {
            namespace,
            missing: vec![format!("create toolruns ({})", s.message)],
        }),
        Err(kube::Error::Api(s)) => Err(StartError::Probe {
            namespace,
            message: s.message.clone(),
        }),
        Err(e) => Err(StartError::Unreachable(e.to_string())),
    }
}
