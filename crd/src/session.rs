//! The `ToolSession` custom resource: `toolrun.dev/v1alpha1`, kind `ToolSession`, short
//! name `ts`.
//!
//! A ToolSession is one session of the gateway on Kubernetes: a workspace that persists
//! across an agent's calls. The gateway creates it on `CreateSession` (tenant in the
//! `toolrun.dev/tenant` label, the caller's id in `spec.sessionId`), the operator turns it
//! into one locked-down pod running `toolrun-runner agent` (container [`AGENT_CONTAINER`])
//! with the workspace on a size-limited volume, and reports the pod in `status.podName`
//! once `status.phase` is `Ready`. File tools reach that agent through the operator's
//! `toolrun.v1.SessionRelay` service; executions (run_code, shell) are ToolRuns naming the
//! session in `spec.session`.
//!
//! Contract between the two sides:
//! - the gateway sets the labels [`crate::labels::TENANT`] and
//!   [`crate::labels::SESSION_ID`], the annotation [`crate::labels::SESSION_ID_ANNOTATION`]
//!   (the id unchanged, when the label had to be cut down) and refreshes
//!   [`crate::labels::LAST_ACTIVITY`] (RFC 3339) at most every few seconds while the
//!   session is used;
//! - the operator writes the status: `phase` (Pending until the agent answers, then Ready;
//!   Failed with a `message` when the pod cannot be made or died; Closed while being
//!   deleted), `podName`, `lastActivity` and `expiresAt` (`lastActivity` +
//!   `spec.idleTimeoutSeconds`), and deletes a session idle past its timeout even when no
//!   gateway runs.
//!
//! The CRD is generated from these types (`crdgen sessions`, see `src/bin/crdgen.rs`) into
//! `deploy/crds/toolrun.dev_toolsessions.yaml`; a test fails when the committed YAML drifts. The spec is immutable; as for ToolRuns there is no field that could ask for
//! privileges, host paths, an image, a service account or a node.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use crate::Limits;

/// Name of the agent's container in a session pod: the relay attaches to it.
pub const AGENT_CONTAINER: &str = "agent";
/// Largest `spec.idleTimeoutSeconds` (a week, the gateway's default bound).
pub const MAX_IDLE_TIMEOUT_SECONDS: u32 = 604_800;
/// Largest `spec.workspace.sizeMiB` (1 TiB).
pub const MAX_WORKSPACE_MIB: u32 = 1_048_576;
/// Smallest `spec.workspace.sizeMiB`.
pub const MIN_WORKSPACE_MIB: u32 = 16;

/// The whole spec is immutable: a session is made once, as asked.
pub(crate) const SESSION_SPEC_IMMUTABLE: &str = "self == oldSelf";
/// The name doubles as a label value and the pod's name prefix.
pub(crate) const SESSION_NAME_IS_LABEL: &str = "self.metadata.name.size() <= 63";

/// One session of the toolrun gateway on Kubernetes: a long-lived agent pod with a workspace.
// Each printcolumn repeats `type_ = "string"`, which clippy takes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[kube(
    group = "toolrun.dev",
    version = "v1alpha1",
    kind = "ToolSession",
    plural = "toolsessions",
    shortname = "ts",
    namespaced,
    status = "ToolSessionStatus",
    derive = "PartialEq",
    doc = "A session of the toolrun gateway: one locked-down agent pod with a workspace, run by the toolrun operator.",
    validation = Rule::new(SESSION_NAME_IS_LABEL).message("metadata.name must be at most 63 characters"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Pod", type_ = "string", json_path = ".status.podName"),
    printcolumn(name = "Approval", type_ = "string", json_path = ".spec.approvalMode"),
    printcolumn(
        name = "Idle-Expiry",
        // A string: kubectl prints a date column as an age, and a time ahead as <invalid>.
        type_ = "string",
        description = "When the session expires unless it is used (UTC)",
        json_path = ".status.expiresAt"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = Rule::new(SESSION_SPEC_IMMUTABLE).message("spec is immutable"))]
#[serde(rename_all = "camelCase")]
pub struct ToolSessionSpec {
    /// The caller's session id, as `CreateSession` returned it (1-64 letters, digits, `-`,
    /// `_`); unique per tenant.
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[A-Za-z0-9_-]+$"))]
    pub session_id: String,
    /// Which calls ask for approval: `none` (every call asks), `safe` (the tools' own
    /// policies) or `all` (nothing asks). The gateway enforces it; shown by kubectl.
    #[serde(default)]
    pub approval_mode: SessionApprovalMode,
    /// Seconds without a call after which the session expires; unset takes the operator's
    /// default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_IDLE_TIMEOUT_SECONDS))]
    pub idle_timeout_seconds: Option<u32>,
    /// The workspace volume.
    #[serde(default, skip_serializing_if = "SessionWorkspace::is_empty")]
    pub workspace: SessionWorkspace,
    /// Limits of the session pod (memory, cpu, processes) and the default of each run in
    /// it; each one left out takes the operator's default.
    #[serde(default, skip_serializing_if = "Limits::is_empty")]
    pub limits: Limits,
    /// RuntimeClass for the pod (e.g. `gvisor`); the operator accepts only classes its
    /// configuration allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub runtime_class_name: Option<String>,
}

/// The workspace volume of a session.
#[derive(Serialize, Deserialize, JsonSchema, Debug, Clone, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SessionWorkspace {
    /// Size of the workspace in MiB (the emptyDir's sizeLimit, or the claim's request);
    /// unset takes the operator's default.
    #[serde(default, rename = "sizeMiB", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_WORKSPACE_MIB, max = MAX_WORKSPACE_MIB))]
    pub size_mib: Option<u32>,
    /// When set, the workspace is a PersistentVolumeClaim of this class (it survives the
    /// pod being rescheduled); otherwise an emptyDir.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub storage_class_name: Option<String>,
}

impl SessionWorkspace {
    /// Nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == SessionWorkspace::default()
    }
}

/// A session's approval mode, named as the gateway's `sessions.default_approval_mode`.
#[derive(Serialize, Deserialize, JsonSchema, Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum SessionApprovalMode {
    // No doc comments on variants (structural schema); see [`ToolSessionSpec::approval_mode`].
    None,
    #[default]
    Safe,
    All,
}

impl SessionApprovalMode {
    /// The mode's name, as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionApprovalMode::None => "none",
            SessionApprovalMode::Safe => "safe",
            SessionApprovalMode::All => "all",
        }
    }
}

/// What the operator observed of a session.
#[derive(Serialize, Deserialize, JsonSchema, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ToolSessionStatus {
    /// Pending (the pod is not serving yet), Ready (the agent answers in `podName`), Failed
    /// (see `message`) or Closed (being deleted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<SessionPhase>,
    /// The pod whose agent serves the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// Why the session is not Ready (e.g. `unschedulable`, `image not found`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The last call the operator knows of (the gateway's `toolrun.dev/last-activity`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub last_activity: Option<Time>,
    /// When the session expires unless it is used: `lastActivity` + the idle timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub expires_at: Option<Time>,
    /// Standard conditions (e.g. `Ready`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Lifecycle phase of a ToolSession.
#[derive(Serialize, Deserialize, JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionPhase {
    // No doc comments on variants (structural schema); see [`ToolSessionStatus::phase`].
    Pending,
    Ready,
    Failed,
    Closed,
}

impl SessionPhase {
    /// The phase's name, as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionPhase::Pending => "Pending",
            SessionPhase::Ready => "Ready",
            SessionPhase::Failed => "Failed",
            SessionPhase::Closed => "Closed",
        }
    }
}

impl ToolSession {
    /// The pod serving the session, when it is Ready.
    pub fn ready_pod(&self) -> Option<&str> {
        let status = self.status.as_ref()?;
        match status.phase {
            Some(SessionPhase::Ready) => status.pod_name.as_deref().filter(|p| !p.is_empty()),
            _ => None,
        }
    }

    /// The tenant label (empty: a gateway without authentication).
    pub fn tenant(&self) -> &str {
        self.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::labels::TENANT))
            .map(String::as_str)
            .unwrap_or_default()
    }
}

fn time_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "string", "format": "date-time" })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use kube::CustomResourceExt;
    use serde_json::{Value, json};

    use super::*;

    const COMMITTED_CRD: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/crds/toolrun.dev_toolsessions.yaml"
    );
    const HELM_CRD: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../helm/toolrun/crds/toolrun.dev_toolsessions.yaml"
    );

    fn crd_json() -> Value {
        serde_json::to_value(ToolSession::crd()).unwrap()
    }

    fn version() -> Value {
        crd_json()["spec"]["versions"][0].clone()
    }

    fn spec_schema() -> Value {
        version()["schema"]["openAPIV3Schema"]["properties"]["spec"].clone()
    }

    #[test]
    fn committed_crds_match_the_types() {
        for path in [COMMITTED_CRD, HELM_CRD] {
            let text = std::fs::read_to_string(Path::new(path)).unwrap_or_else(|e| {
                panic!("cannot read {path}: {e}; generate it with `cargo run -p toolrun-crd --bin crdgen sessions`")
            });
            let committed: Value = serde_yaml_ng::from_str(&text).unwrap();
            assert!(
                committed == crd_json(),
                "{path} is out of date with the ToolSession types; regenerate it: \
                 cargo run -p toolrun-crd --bin crdgen sessions > deploy/crds/toolrun.dev_toolsessions.yaml \
                 and copy it into helm/toolrun/crds/"
            );
        }
    }

    #[test]
    fn names_scope_columns_and_subresources() {
        let crd = crd_json();
        assert_eq!(crd["metadata"]["name"], "toolsessions.toolrun.dev");
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        let names = &crd["spec"]["names"];
        assert_eq!(names["kind"], "ToolSession");
        assert_eq!(names["shortNames"], json!(["ts"]));
        let v = version();
        assert_eq!(v["name"], crate::VERSION);
        assert_eq!(v["subresources"]["status"], json!({}));
        let columns: Vec<(String, String)> = v["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_string(),
                    c["jsonPath"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let expected = [
            ("Phase", ".status.phase"),
            ("Pod", ".status.podName"),
            ("Approval", ".spec.approvalMode"),
            ("Idle-Expiry", ".status.expiresAt"),
            ("Age", ".metadata.creationTimestamp"),
        ];
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(columns, expected);
    }

    fn validate_spec(spec: &Value) -> Result<(), String> {
        let schema = spec_schema();
        let validator = jsonschema::validator_for(&schema).map_err(|e| e.to_string())?;
        let errors: Vec<String> = validator.iter_errors(spec).map(|e| e.to_string()).collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    fn good_spec() -> Value {
        json!({
            "sessionId": "s-1f2e_A",
            "approvalMode": "safe",
            "idleTimeoutSeconds": 1800,
            "workspace": {"sizeMiB": 1024, "storageClassName": "standard"},
            "limits": {"memoryMiB": 512, "cpuMillis": 500, "processes": 128},
            "runtimeClassName": "gvisor"
        })
    }

    fn with(mut spec: Value, pointer: &str, value: Value) -> Value {
        *spec.pointer_mut(pointer).unwrap() = value;
        spec
    }

    #[test]
    fn schema_accepts_a_sensible_spec_and_the_smallest() {
        validate_spec(&good_spec()).unwrap();
        validate_spec(&json!({"sessionId": "x"})).unwrap();
        let spec: ToolSessionSpec = serde_json::from_value(good_spec()).unwrap();
        assert_eq!(spec.workspace.size_mib, Some(1024));
        assert_eq!(spec.approval_mode, SessionApprovalMode::Safe);
        assert_eq!(serde_json::to_value(&spec).unwrap(), good_spec());
        let bare: ToolSessionSpec = serde_json::from_value(json!({"sessionId": "x"})).unwrap();
        assert_eq!(bare.approval_mode, SessionApprovalMode::Safe);
        assert!(bare.workspace.is_empty() && bare.limits.is_empty());
    }

    #[test]
    fn schema_rejects_nonsense() {
        let cases = [
            ("/sessionId", json!("")),
            ("/sessionId", json!("a b")),
            ("/sessionId", json!("x".repeat(65))),
            ("/approvalMode", json!("sometimes")),
            ("/approvalMode", json!("SAFE")),
            ("/idleTimeoutSeconds", json!(0)),
            ("/idleTimeoutSeconds", json!(MAX_IDLE_TIMEOUT_SECONDS + 1)),
            ("/workspace/sizeMiB", json!(MIN_WORKSPACE_MIB - 1)),
            ("/workspace/sizeMiB", json!(MAX_WORKSPACE_MIB + 1)),
            ("/workspace/storageClassName", json!("Not A Class")),
            ("/limits/memoryMiB", json!(0)),
            ("/limits/processes", json!(-1)),
            ("/runtimeClassName", json!("")),
        ];
        for (pointer, value) in cases {
            let spec = with(good_spec(), pointer, value.clone());
            assert!(
                validate_spec(&spec).is_err(),
                "{pointer} = {value} was accepted"
            );
        }
        let mut no_id = good_spec();
        no_id.as_object_mut().unwrap().remove("sessionId");
        assert!(validate_spec(&no_id).is_err(), "sessionId is not required");
    }

    #[test]
    fn nothing_in_the_resource_can_ask_for_privileges_or_host_access() {
        let text = serde_json::to_string(&version()["schema"]).unwrap();
        for f in [
            "\"hostPath\"",
            "\"privileged\"",
            "\"hostNetwork\"",
            "\"capabilities\"",
            "\"securityContext\"",
            "\"volumes\"",
            "\"serviceAccountName\"",
            "\"nodeName\"",
            "\"image\"",
            "\"command\"",
        ] {
            assert!(!text.contains(f), "the ToolSession schema has a {f} field");
        }
        let spec = spec_schema();
        let fields: Vec<&str> = spec["properties"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            fields,
            [
                "approvalMode",
                "idleTimeoutSeconds",
                "limits",
                "runtimeClassName",
                "sessionId",
                "workspace"
            ]
        );
    }

    fn object(name: &str, spec: Value) -> Value {
        json!({
            "apiVersion": "toolrun.dev/v1alpha1",
            "kind": "ToolSession",
            "metadata": {"name": name, "namespace": "toolrun-sandbox"},
            "spec": spec,
        })
    }

    fn validate_cel(new: &Value, old: Option<&Value>) -> Result<(), String> {
        let schema = &version()["schema"]["openAPIV3Schema"];
        kube_cel::validate(schema, new, old).map_err(|e| format!("{e:?}"))
    }

    #[test]
    fn cel_rules_compile_and_the_spec_is_immutable() {
        let schema = &version()["schema"]["openAPIV3Schema"];
        let compiled = kube_cel::compile_schema(schema);
        assert!(
            !compiled.has_errors(),
            "{:?}",
            compiled.compilation_errors()
        );
        let old = object("ts-1", good_spec());
        validate_cel(&old, None).unwrap();
        validate_cel(&old, Some(&old)).unwrap();
        for (pointer, value) in [
            ("/sessionId", json!("other")),
            ("/approvalMode", json!("all")),
            ("/idleTimeoutSeconds", json!(60)),
            ("/workspace/sizeMiB", json!(2048)),
            ("/limits/memoryMiB", json!(1024)),
            ("/runtimeClassName", json!("kata")),
        ] {
            let new = object("ts-1", with(good_spec(), pointer, value));
            let err = validate_cel(&new, Some(&old)).expect_err(pointer);
            assert!(err.contains("spec is immutable"), "{pointer}: {err}");
        }
        for field in [
            "idleTimeoutSeconds",
            "workspace",
            "limits",
            "runtimeClassName",
        ] {
            let mut removed = good_spec();
            removed.as_object_mut().unwrap().remove(field);
            let removed = object("ts-1", removed);
            assert!(
                validate_cel(&removed, Some(&old)).is_err(),
                "removing {field}"
            );
            assert!(
                validate_cel(&old, Some(&removed)).is_err(),
                "adding {field}"
            );
        }
        validate_cel(&object(&"a".repeat(63), good_spec()), None).unwrap();
        assert!(validate_cel(&object(&"a".repeat(64), good_spec()), None).is_err());
    }

    #[test]
    fn status_wire_names_and_ready_pod() {
        let status = ToolSessionStatus {
            phase: Some(SessionPhase::Ready),
            pod_name: Some("ts-1-agent".into()),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&status).unwrap(),
            json!({"phase": "Ready", "podName": "ts-1-agent"})
        );
        let phases = &version()["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
            ["phase"]["enum"];
        assert_eq!(
            phases,
            &json!(["Pending", "Ready", "Failed", "Closed", null])
        );
        let mut s: ToolSession = serde_json::from_value(object("ts-1", good_spec())).unwrap();
        assert_eq!(s.ready_pod(), None);
        s.status = Some(status.clone());
        assert_eq!(s.ready_pod(), Some("ts-1-agent"));
        s.status = Some(ToolSessionStatus {
            phase: Some(SessionPhase::Pending),
            ..status
        });
        assert_eq!(s.ready_pod(), None, "only a Ready session has a pod to use");
        assert_eq!(s.tenant(), "");
    }
}
