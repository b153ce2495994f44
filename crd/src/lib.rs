//! The `ToolRun` custom resource: `toolrun.dev/v1alpha1`, kind `ToolRun`, short name `tr`.
//!
//! A ToolRun is one execution of untrusted code. The gateway (or anyone with `kubectl`)
//! creates it; the operator turns it into a locked-down pod and writes the runner's record
//! into its status. This crate is only the shape of the resource, shared by both sides; it
//! knows nothing of clients, controllers or servers.
//!
//! The CRD is generated from these types (`cargo run -p toolrun-crd --bin crdgen >
//! deploy/crds/toolrun.dev_toolruns.yaml`); a test fails when the committed YAML drifts.
//!
//! What the API server enforces (schema bounds and CEL, see [`ToolRunSpec`]):
//! - every limit is positive and bounded; code, stdin, args and env are size-bounded, so
//!   a ToolRun with its status always fits in one etcd object;
//! - env names are identifiers;
//! - the spec is immutable once created, except `cancel`, which can only go false -> true;
//! - the name is at most 63 characters, so it is a valid label value and pod hostname;
//! - a run is a `language` with its `code`, or an `image` with its `command` (a custom
//!   tool's image), never both; an image run has no session.
//!
//! There is deliberately no field that could ask for privileges, host paths, host
//! namespaces, capabilities, volumes, a service account or a node: the pod's security
//! context is the operator's alone. `image` chooses only the run container's image, and
//! the operator runs it only when its `toolImages` allow-list names it (empty by default:
//! no image runs), with the same lockdown as every sandbox pod.

pub mod labels;
pub mod session;
pub mod tool;

pub use session::{ToolSession, ToolSessionSpec, ToolSessionStatus};
pub use tool::{Tool, ToolSpec, ToolStatus};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// API group of the resource.
pub const GROUP: &str = "toolrun.dev";
/// API version of the resource.
pub const VERSION: &str = "v1alpha1";
/// Largest `spec.code`, in characters.
pub const MAX_CODE_CHARS: u32 = 50_000;
/// Largest `spec.stdin`, in characters. With code and the status's two output streams
/// this keeps a ToolRun well under etcd's 1.5 MiB object limit.
pub const MAX_STDIN_CHARS: u32 = 65_536;
/// Largest `spec.limits.outputBytes`: each stream is copied into the status, so this
/// bounds the status size too.
pub const MAX_OUTPUT_BYTES: u32 = 262_144;
/// Largest `spec.limits.timeoutSeconds` (one hour).
pub const MAX_TIMEOUT_SECONDS: u32 = 3_600;

/// The spec is immutable except `cancel`. One rule on the whole spec, rather than
/// `self == oldSelf` on each field, because a field-level transition rule is skipped
/// when the field is added or removed; here each optional field must also keep its
/// presence.
const SPEC_IMMUTABLE: &str = concat!(
    "self.tool == oldSelf.tool",
    " && has(self.callId) == has(oldSelf.callId) && (!has(self.callId) || self.callId == oldSelf.callId)",
    " && has(self.language) == has(oldSelf.language) && (!has(self.language) || self.language == oldSelf.language)",
    " && has(self.code) == has(oldSelf.code) && (!has(self.code) || self.code == oldSelf.code)",
    " && has(self.image) == has(oldSelf.image) && (!has(self.image) || self.image == oldSelf.image)",
    " && has(self.command) == has(oldSelf.command) && (!has(self.command) || self.command == oldSelf.command)",
    " && has(self.args) == has(oldSelf.args) && (!has(self.args) || self.args == oldSelf.args)",
    " && has(self.env) == has(oldSelf.env) && (!has(self.env) || self.env == oldSelf.env)",
    " && has(self.stdin) == has(oldSelf.stdin) && (!has(self.stdin) || self.stdin == oldSelf.stdin)",
    " && has(self.limits) == has(oldSelf.limits) && (!has(self.limits) || self.limits == oldSelf.limits)",
    " && has(self.ttlSecondsAfterFinished) == has(oldSelf.ttlSecondsAfterFinished)",
    " && (!has(self.ttlSecondsAfterFinished) || self.ttlSecondsAfterFinished == oldSelf.ttlSecondsAfterFinished)",
    " && has(self.runtimeClassName) == has(oldSelf.runtimeClassName)",
    " && (!has(self.runtimeClassName) || self.runtimeClassName == oldSelf.runtimeClassName)",
    " && has(self.session) == has(oldSelf.session) && (!has(self.session) || self.session == oldSelf.session)",
);
/// Cancelling is one-way: a cancelled run cannot be resumed.
const CANCEL_ONE_WAY: &str =
    "!has(oldSelf.cancel) || !oldSelf.cancel || (has(self.cancel) && self.cancel)";
/// What runs: a language and its code, or an image and its command.
const ONE_PROGRAM: &str = "(has(self.language) && has(self.code) && !has(self.image) && !has(self.command)) \
    || (!has(self.language) && !has(self.code) && has(self.image) && has(self.command))";
/// A session's runs execute in the session's pod, whose image is the session's.
const IMAGE_WITHOUT_SESSION: &str = "!has(self.image) || !has(self.session)";
/// The name doubles as the `toolrun.dev/run` label value, which is at most 63 characters.
const NAME_IS_LABEL: &str = "self.metadata.name.size() <= 63";

/// One execution of untrusted code in a sandbox pod.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[kube(
    group = "toolrun.dev",
    version = "v1alpha1",
    kind = "ToolRun",
    plural = "toolruns",
    shortname = "tr",
    namespaced,
    status = "ToolRunStatus",
    derive = "PartialEq",
    doc = "One execution of untrusted code, run by the toolrun operator in a locked-down pod.",
    validation = Rule::new(NAME_IS_LABEL).message("metadata.name must be at most 63 characters"),
    printcolumn(name = "Tool", type_ = "string", json_path = ".spec.tool"),
    printcolumn(name = "Language", type_ = "string", json_path = ".spec.language"),
    printcolumn(
        name = "Image",
        type_ = "string",
        priority = 1,
        json_path = ".spec.image"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Verdict", type_ = "string", json_path = ".status.verdict"),
    printcolumn(name = "Exit", type_ = "integer", json_path = ".status.exitCode"),
    printcolumn(
        name = "Duration(ms)",
        type_ = "integer",
        description = "Wall-clock duration of the program, in milliseconds",
        json_path = ".status.durationMs"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(
    validation = Rule::new(SPEC_IMMUTABLE).message("spec is immutable except cancel"),
    validation = Rule::new(CANCEL_ONE_WAY).message("cancel cannot be undone"),
    validation = Rule::new(ONE_PROGRAM).message("give language and code, or image and command"),
    validation = Rule::new(IMAGE_WITHOUT_SESSION).message("an image run cannot run in a session")
)]
#[serde(rename_all = "camelCase")]
pub struct ToolRunSpec {
    /// Name of the tool that asked for this run; `run_code` when left out.
    #[serde(default = "default_tool")]
    #[schemars(length(min = 1, max = 128))]
    pub tool: String,
    /// The caller's call id (copied, sanitised, into the `toolrun.dev/call-id` label); the
    /// object's own name when left out.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = 256))]
    pub call_id: String,
    /// The program's language: `python`, `javascript`, `bash`, or one of the operator's
    /// configured `languages` (e.g. `typescript`, `c`); an unknown name fails the run with
    /// the configured names in its reason. Given with `code`, or left out for an `image`
    /// run (empty here).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = 32), regex(pattern = r"^[a-z][a-z0-9_-]*$"))]
    pub language: String,
    /// Program source. It reaches the pod only inside the run's ConfigMap, never on a
    /// command line. Given with `language` (empty here for an `image` run).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = MAX_CODE_CHARS))]
    pub code: String,
    /// Instead of a language: the container image that runs `command` (a custom tool's
    /// image). The operator runs it only when its `toolImages` allow it; otherwise the run
    /// fails (INFRA_ERROR) with the reason and no pod is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512), regex(pattern = r"^\S+$"))]
    pub image: Option<String>,
    /// The argv run in `image` (`args` are appended): its first element is an absolute
    /// path or a name found on the base environment's PATH. It reaches the pod only inside
    /// the run's ConfigMap, as code does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1, max = 64), inner(length(min = 1, max = 4096)))]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub command: Vec<String>,
    /// Arguments passed to the program.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 1024)))]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub args: Vec<String>,
    /// Environment variables added to the operator's base environment (PATH, HOME, LANG).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub env: Vec<EnvVar>,
    /// Text written to the program's stdin, which is then closed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = MAX_STDIN_CHARS))]
    pub stdin: String,
    /// Resource limits; each one left out takes the operator's default.
    #[serde(default, skip_serializing_if = "Limits::is_empty")]
    pub limits: Limits,
    /// Seconds after the run finishes before the ToolRun (with its pod and ConfigMap) is
    /// deleted; unset takes the operator's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 604_800))]
    pub ttl_seconds_after_finished: Option<u32>,
    /// RuntimeClass for the pod (e.g. `gvisor`); the operator accepts only classes its
    /// configuration allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub runtime_class_name: Option<String>,
    /// The ToolSession (its name) this run executes in: the operator runs it in that
    /// session's pod, with the session's workspace. Unset: a pod of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub session: Option<String>,
    /// Set to true to stop the run. The only field that may change after creation.
    #[serde(default, skip_serializing_if = "is_false")]
    pub cancel: bool,
}

fn default_tool() -> String {
    "run_code".to_string()
}

impl ToolRun {
    /// The run's call id: `spec.callId`, or the object's name when a person applied the
    /// ToolRun without one.
    pub fn call_id(&self) -> &str {
        match self.spec.call_id.as_str() {
            "" => self.metadata.name.as_deref().unwrap_or_default(),
            id => id,
        }
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One environment variable of the program.
#[derive(Serialize, Deserialize, JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct EnvVar {
    /// Variable name: a C identifier.
    #[schemars(
        length(min = 1, max = 128),
        regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]*$")
    )]
    pub name: String,
    /// Value.
    #[serde(default)]
    #[schemars(length(max = 1024))]
    pub value: String,
}

/// Resource limits of one run. All are positive; an unset one takes the operator's
/// default, and the operator refuses values above its configured maximum.
#[derive(Serialize, Deserialize, JsonSchema, Debug, Clone, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Wall-clock limit of the program, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_TIMEOUT_SECONDS))]
    pub timeout_seconds: Option<u32>,
    /// Memory of the pod in MiB (requests = limits), /tmp included (it is in memory).
    #[serde(default, rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 16, max = 65_536))]
    pub memory_mib: Option<u32>,
    /// CPU of the pod in millicores (requests = limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 64_000))]
    pub cpu_millis: Option<u32>,
    /// Most processes (and threads) the program may have at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 32_768))]
    pub processes: Option<u32>,
    /// Bytes kept of each of stdout and stderr; past this the program is stopped with
    /// OUTPUT_LIMIT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_OUTPUT_BYTES))]
    pub output_bytes: Option<u32>,
}

impl Limits {
    /// No limit is set.
    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }
}

/// What the operator observed of a run.
#[derive(Serialize, Deserialize, JsonSchema, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ToolRunStatus {
    /// Pending (no result yet, pod not running), Running, Succeeded (verdict OK) or Failed
    /// (any other verdict).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// How the run ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
    /// Why the verdict is not OK (e.g. `image not found`, `unschedulable`, the runner's
    /// message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Exit status of the program; 128 + signal number for a signal death.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Captured stdout, at most `limits.outputBytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    /// Captured stderr, at most `limits.outputBytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    /// stdout was cut at the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_truncated: Option<bool>,
    /// stderr was cut at the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_truncated: Option<bool>,
    /// When the pod started running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub start_time: Option<Time>,
    /// When the result was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub completion_time: Option<Time>,
    /// Wall-clock duration of the program, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// The pod that ran (or runs) the program.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// Standard conditions (e.g. `Ready` = the result is recorded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The files the program left in its outputs directory (`/tmp/outputs`), content
    /// base64-encoded, bounded by the operator's `artifacts` configuration and by what is
    /// left of the object's size (an etcd object holds about 1.5 MiB): a file cut short is
    /// `truncated`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub artifacts: Vec<Artifact>,
    /// Entries of the outputs directory that were not returned, and why (a symlink, a
    /// FIFO, over the file count...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub artifacts_omitted: Vec<OmittedArtifact>,
    /// Some files were left out or cut (count or size limits).
    #[serde(default, skip_serializing_if = "is_false")]
    pub artifacts_truncated: bool,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A file the program wrote to its outputs directory (the runner's
/// [`toolrun_runner::artifacts::Artifact`]).
#[derive(Serialize, Deserialize, JsonSchema, Debug, Clone, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    /// Path relative to the outputs directory.
    pub name: String,
    /// The file's whole size in bytes.
    pub size: u64,
    /// e.g. image/png, text/csv.
    pub media_type: String,
    /// The content (or its first part when `truncated`), standard base64.
    #[serde(default)]
    pub content_base64: String,
    /// `contentBase64` holds less than the whole file.
    #[serde(default)]
    pub truncated: bool,
}

/// An entry of the outputs directory that was not returned.
#[derive(Serialize, Deserialize, JsonSchema, Debug, Clone, Default, PartialEq, Eq)]
pub struct OmittedArtifact {
    /// Path relative to the outputs directory.
    pub name: String,
    /// Why it was not returned.
    pub reason: String,
}

impl From<toolrun_runner::artifacts::Artifact> for Artifact {
    fn from(a: toolrun_runner::artifacts::Artifact) -> Self {
        Artifact {
            name: a.name,
            size: a.size,
            media_type: a.media_type,
            content_base64: a.content_base64,
            truncated: a.truncated,
        }
    }
}

impl From<Artifact> for toolrun_runner::artifacts::Artifact {
    fn from(a: Artifact) -> Self {
        toolrun_runner::artifacts::Artifact {
            name: a.name,
            size: a.size,
            media_type: a.media_type,
            content_base64: a.content_base64,
            truncated: a.truncated,
        }
    }
}

/// Lifecycle phase of a ToolRun.
#[derive(Serialize, Deserialize, JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    // No doc comments on variants (structural schema); see [`ToolRunStatus::phase`].
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl Phase {
    /// The run is over and its status will not change again.
    pub fn is_finished(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }

    /// The phase of a run that ended with `verdict`.
    pub fn finished_with(verdict: Verdict) -> Phase {
        if verdict == Verdict::Ok {
            Phase::Succeeded
        } else {
            Phase::Failed
        }
    }
}

/// How a run ended; the runner's verdicts, as on the wire.
#[derive(Serialize, Deserialize, JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Verdict {
    // Meanings: see toolrun_runner::Verdict (no doc comments here: structural schema).
    Ok,
    RuntimeError,
    Timeout,
    MemoryLimit,
    OutputLimit,
    Cancelled,
    InfraError,
}

impl Verdict {
    /// SCREAMING_SNAKE_CASE name, as on the wire.
    pub fn as_str(self) -> &'static str {
        toolrun_runner::Verdict::from(self).as_str()
    }
}

impl From<toolrun_runner::Verdict> for Verdict {
    fn from(v: toolrun_runner::Verdict) -> Self {
        use toolrun_runner::Verdict as R;
        match v {
            R::Ok => Verdict::Ok,
            R::RuntimeError => Verdict::RuntimeError,
            R::Timeout => Verdict::Timeout,
            R::MemoryLimit => Verdict::MemoryLimit,
            R::OutputLimit => Verdict::OutputLimit,
            R::Cancelled => Verdict::Cancelled,
            R::InfraError => Verdict::InfraError,
        }
    }
}

impl From<Verdict> for toolrun_runner::Verdict {
    fn from(v: Verdict) -> Self {
        use toolrun_runner::Verdict as R;
        match v {
            Verdict::Ok => R::Ok,
            Verdict::RuntimeError => R::RuntimeError,
            Verdict::Timeout => R::Timeout,
            Verdict::MemoryLimit => R::MemoryLimit,
            Verdict::OutputLimit => R::OutputLimit,
            Verdict::Cancelled => R::Cancelled,
            Verdict::InfraError => R::InfraError,
        }
    }
}

fn time_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "string", "format": "date-time" })
}

/// `metav1.Condition`, as the API server's own types describe it.
pub(crate) fn conditions_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "required": ["type", "status", "lastTransitionTime", "reason", "message"],
            "properties": {
                "type": { "type": "string", "maxLength": 316 },
                "status": { "type": "string", "enum": ["True", "False", "Unknown"] },
                "observedGeneration": { "type": "integer", "format": "int64", "minimum": 0 },
                "lastTransitionTime": { "type": "string", "format": "date-time" },
                "reason": { "type": "string", "maxLength": 1024 },
                "message": { "type": "string", "maxLength": 32768 }
            }
        }
    })
}

/// The CRD as YAML, as committed in `deploy/crds/toolrun.dev_toolruns.yaml`.
pub fn crd_yaml() -> Result<String, serde_yaml_ng::Error> {
    serde_yaml_ng::to_string(&ToolRun::crd())
}

/// The ToolSession CRD as YAML, as committed in `deploy/crds/toolrun.dev_toolsessions.yaml`.
pub fn session_crd_yaml() -> Result<String, serde_yaml_ng::Error> {
    serde_yaml_ng::to_string(&ToolSession::crd())
}

/// The Tool CRD as YAML, as committed in `deploy/crds/toolrun.dev_tools.yaml`.
pub fn tool_crd_yaml() -> Result<String, serde_yaml_ng::Error> {
    serde_yaml_ng::to_string(&Tool::crd())
}

#[cfg(test)]
mod tests;
