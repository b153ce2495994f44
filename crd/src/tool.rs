//! The `Tool` custom resource: `toolrun.dev/v1alpha1`, kind `Tool`, short name `tl`.
//!
//! A Tool declares a custom tool on Kubernetes, as `custom_tools` entries do in the
//! gateway's configuration file: its name, description, JSON Schemas, behaviour hints,
//! limits, and an implementation (a script in a sandbox language, or an image and a
//! command). The gateway watches Tools in its sandbox namespace, serves the valid ones and
//! writes each one's verdict into its status: condition `Ready` True (reason `Loaded`) or
//! False (reason `Invalid`, with why in the message). `kubectl get tools` shows both.
//!
//! The CRD is generated from these types (`cargo run -p toolrun-crd --bin crdgen tools >
//! deploy/crds/toolrun.dev_tools.yaml`); a test fails when the committed YAML drifts.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::MAX_CODE_CHARS;

/// The condition the gateway writes: True when the tool is served.
pub const READY: &str = "Ready";
/// Reason of a served tool.
pub const REASON_LOADED: &str = "Loaded";
/// Reason of a refused tool (the message says why).
pub const REASON_INVALID: &str = "Invalid";

/// Exactly one implementation: a language with a script, or an image with a command.
const ONE_IMPLEMENTATION: &str = "(has(self.language) && has(self.script) && !has(self.image) && !has(self.command)) \
    || (!has(self.language) && !has(self.script) && has(self.image) && has(self.command))";

/// A custom tool served by the toolrun gateway.
// Each printcolumn repeats `type_ = "string"`, which clippy takes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[kube(
    group = "toolrun.dev",
    version = "v1alpha1",
    kind = "Tool",
    plural = "tools",
    shortname = "tl",
    namespaced,
    status = "ToolStatus",
    derive = "PartialEq",
    doc = "A custom tool served by the toolrun gateway: schemas, hints and an implementation that runs in the sandbox.",
    printcolumn(
        name = "Tool",
        type_ = "string",
        description = "The name models call",
        json_path = ".spec.name"
    ),
    printcolumn(
        name = "Language",
        type_ = "string",
        json_path = ".spec.implementation.language"
    ),
    printcolumn(
        name = "Image",
        type_ = "string",
        priority = 1,
        json_path = ".spec.implementation.image"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        priority = 1,
        json_path = ".status.conditions[?(@.type==\"Ready\")].message"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ToolSpec {
    /// The name models call (`^[a-zA-Z0-9_-]{1,64}$`); the object's name when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[a-zA-Z0-9_-]+$"))]
    pub name: Option<String>,
    /// Display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub title: Option<String>,
    /// What the tool does, written for a model.
    #[schemars(length(min = 1, max = 4096))]
    pub description: String,
    /// JSON Schema of the arguments: an object schema with `properties`.
    #[schemars(schema_with = "any_object")]
    pub input_schema: Value,
    /// JSON Schema of the output (default: any JSON object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub output_schema: Option<Value>,
    /// Behaviour hints (MCP annotations); `destructive` asks for approval in a session.
    #[serde(default, skip_serializing_if = "Hints::is_empty")]
    pub annotations: Hints,
    /// Longest a call may take, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 100, max = 60_000))]
    pub timeout_ms: Option<u64>,
    /// Sandbox limits over the gateway's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ToolLimits>,
    /// What runs.
    pub implementation: Implementation,
}

/// Behaviour hints of a tool.
#[derive(Serialize, Deserialize, JsonSchema, Debug, Clone, Copy, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Hints {
    /// Changes nothing.
    #[serde(default)]
    pub read_only: bool,
    /// May destroy or overwrite things.
    #[serde(default)]
    pub destructive: bool,
    /// Calling again with the same arguments has no further effect.
    #[serde(default)]
    pub idempotent: bool,
    /// Reaches things beyond the gateway and its sandbox.
    #[serde(default)]
    pub open_world: bool,
}

impl Hints {
    /// No hint is set.
    pub fn is_empty(&self) -> bool {
        *self == Hints::default()
    }
}

/// Sandbox limits of a tool's runs; each one left out takes the gateway's default.
#[derive(Serialize, Deserialize, JsonSchema, Debug, Clone, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ToolLimits {
    /// Memory, MiB.
    #[serde(default, rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 16, max = 65_536))]
    pub memory_mib: Option<u64>,
    /// CPU time, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3_600))]
    pub cpu_seconds: Option<u64>,
    /// Processes and threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4_096))]
    pub processes: Option<u64>,
    /// Bytes kept of each output stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1_024, max = 262_144))]
    pub output_bytes: Option<u64>,
}

/// How the tool runs: a script in a sandbox language, or an image and its command.
#[derive(KubeSchema, Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[x_kube(validation = Rule::new(ONE_IMPLEMENTATION).message("give language and script, or image and command"))]
#[serde(rename_all = "camelCase")]
pub struct Implementation {
    /// Language of `script`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "language_schema")]
    pub language: Option<String>,
    /// The script: reads the arguments as JSON on stdin, prints one JSON value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_CODE_CHARS))]
    pub script: Option<String>,
    /// A container image whose `command` reads the arguments on stdin; only images the
    /// chart's `sandbox.toolImages` names run (the gateway refuses others in the status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,
    /// The image's command and its arguments: the first element an absolute path or a name
    /// on the sandbox's PATH.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), inner(length(max = 4096)))]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub command: Option<Vec<String>>,
}

/// What the gateway observed of a Tool.
#[derive(Serialize, Deserialize, JsonSchema, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ToolStatus {
    /// `Ready`: True when served (reason `Loaded`), False when refused (reason `Invalid`,
    /// the message says why).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl Tool {
    /// The name models call: `spec.name`, or the object's name.
    pub fn tool_name(&self) -> &str {
        match &self.spec.name {
            Some(n) => n,
            None => self.metadata.name.as_deref().unwrap_or_default(),
        }
    }

    /// The `Ready` condition, when written.
    pub fn ready(&self) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == READY)
    }
}

/// Checks one entry of an image allow-list (the operator's `toolImages`, the gateway's
/// `sandbox.kubernetes.toolImages`): an image reference as written (`toolrun/sandbox:0.1.0`,
/// `registry.example.com/tools/wc@sha256:...`), or a prefix ending in `/*` (every image
/// under a registry or repository path), `:*` (every tag of one repository) or `@*` (every
/// digest of one repository). Nothing else: a bare `*`, or `registry.example.com*` (which
/// would also match `registry.example.com.evil.example/...`), is refused.
pub fn check_image_pattern(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() || pattern.len() > 512 || pattern.contains(char::is_whitespace) {
        return Err(format!(
            "{pattern:?} is not an image reference (1-512 characters, no spaces)"
        ));
    }
    match pattern.find('*') {
        None => Ok(()),
        Some(i)
            if i + 1 == pattern.len()
                && i >= 2
                && matches!(pattern.as_bytes()[i - 1], b'/' | b':' | b'@') =>
        {
            Ok(())
        }
        Some(_) => Err(format!(
            "{pattern:?}: `*` may only end a prefix, after `/`, `:` or `@` \
             (e.g. registry.example.com/tools/*, toolrun/sandbox:*)"
        )),
    }
}

/// Whether `image` is allowed by `patterns` ([`check_image_pattern`]'s forms): equal to an
/// entry, or starting with a prefix entry's text before its `*`. References are compared
/// as written, without normalisation (`python:3` and `docker.io/library/python:3` are two
/// entries). An empty list allows nothing.
pub fn image_allowed(patterns: &[String], image: &str) -> bool {
    if image.is_empty() || image.contains(char::is_whitespace) {
        return false;
    }
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => image.len() > prefix.len() && image.starts_with(prefix),
        None => p == image,
    })
}

/// A language name (built in or configured), as ToolRun's `spec.language`.
fn language_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "Language of `script`: python, javascript, bash or a configured one.",
        "type": "string",
        "minLength": 1,
        "maxLength": 32,
        "pattern": "^[a-z][a-z0-9_-]*$"
    })
}

/// A JSON Schema document: any object, kept as written.
fn any_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use kube::CustomResourceExt;
    use serde_json::{Value, json};

    use super::*;

    const COMMITTED: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/crds/toolrun.dev_tools.yaml"
    );

    fn version() -> Value {
        let crd = serde_json::to_value(Tool::crd()).unwrap();
        crd["spec"]["versions"][0].clone()
    }

    fn object(spec: Value) -> Value {
        json!({
            "apiVersion": "toolrun.dev/v1alpha1",
            "kind": "Tool",
            "metadata": {"name": "word-count", "namespace": "toolrun-sandbox"},
            "spec": spec,
        })
    }

    fn good_spec() -> Value {
        json!({
            "name": "word_count",
            "description": "Counts words.",
            "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}},
                            "required": ["text"]},
            "outputSchema": {"type": "object", "properties": {"words": {"type": "integer"}}},
            "annotations": {"readOnly": true, "idempotent": true},
            "timeoutMs": 5000,
            "limits": {"memoryMiB": 128},
            "implementation": {"language": "python", "script": "print(1)"},
        })
    }

    /// The API server's checks: the schema (bounds, patterns, enums), then the CEL rules.
    fn validate(spec: Value) -> Result<(), String> {
        let schema = &version()["schema"]["openAPIV3Schema"];
        let validator = jsonschema::validator_for(&schema["properties"]["spec"]).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&spec)
            .map(|e| e.to_string())
            .collect();
        if !errors.is_empty() {
            return Err(errors.join("; "));
        }
        kube_cel::validate(schema, &object(spec), None).map_err(|e| format!("{e:?}"))
    }

    #[test]
    fn committed_crd_matches_the_types() {
        let text = std::fs::read_to_string(Path::new(COMMITTED)).unwrap_or_else(|e| {
            panic!("cannot read {COMMITTED}: {e}; generate it with `cargo run -p toolrun-crd --bin crdgen tools > deploy/crds/toolrun.dev_tools.yaml`")
        });
        let committed: Value = serde_yaml_ng::from_str(&text).unwrap();
        assert!(
            committed == serde_json::to_value(Tool::crd()).unwrap(),
            "deploy/crds/toolrun.dev_tools.yaml is out of date with the Tool types; regenerate \
             it: cargo run -p toolrun-crd --bin crdgen tools > deploy/crds/toolrun.dev_tools.yaml"
        );
    }

    #[test]
    fn names_short_name_status_and_columns() {
        let crd = serde_json::to_value(Tool::crd()).unwrap();
        assert_eq!(crd["metadata"]["name"], "tools.toolrun.dev");
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        assert_eq!(crd["spec"]["names"]["shortNames"], json!(["tl"]));
        let v = version();
        assert_eq!(v["name"], crate::VERSION);
        assert_eq!(v["subresources"]["status"], json!({}));
        let columns: Vec<&str> = v["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            columns,
            [
                "Tool", "Language", "Image", "Ready", "Reason", "Message", "Age"
            ]
        );
    }

    #[test]
    fn schema_and_cel_accept_a_tool_and_refuse_nonsense() {
        validate(good_spec()).unwrap();
        let image = json!({"image": "registry.example/wc:1", "command": ["/wc"]});
        let mut s = good_spec();
        s["implementation"] = image.clone();
        validate(s).unwrap();
        for (pointer, value, why) in [
            ("/name", json!("has space"), "does not match"),
            ("/description", json!(""), "shorter"),
            ("/timeoutMs", json!(50), "less than the minimum"),
            ("/implementation/language", json!("Cobol"), "does not match"),
            ("/limits/memoryMiB", json!(1), "less than the minimum"),
            (
                "/implementation",
                json!({"language": "python"}),
                "language and script",
            ),
            ("/implementation", json!({}), "language and script"),
            (
                "/implementation",
                json!({"language": "bash", "script": "x", "image": "i", "command": ["c"]}),
                "give language and script",
            ),
        ] {
            let mut s = good_spec();
            *s.pointer_mut(pointer).unwrap() = value.clone();
            let e = validate(s).expect_err(&format!("{pointer} = {value} accepted"));
            assert!(e.contains(why), "{pointer} = {value}: {e}");
        }
    }

    #[test]
    fn image_allow_lists_match_exactly_or_by_an_anchored_prefix() {
        let list: Vec<String> = [
            "toolrun/sandbox:0.1.0",
            "registry.example.com/tools/*",
            "python:*",
            "ghcr.io/acme/wc@*",
        ]
        .map(String::from)
        .to_vec();
        for p in &list {
            check_image_pattern(p).unwrap();
        }
        for allowed in [
            "toolrun/sandbox:0.1.0",
            "registry.example.com/tools/wc:1",
            "registry.example.com/tools/a/b@sha256:00",
            "python:3.12-slim",
            "ghcr.io/acme/wc@sha256:abcd",
        ] {
            assert!(image_allowed(&list, allowed), "{allowed} refused");
        }
        for refused in [
            // Another tag, another repository, the registry's name extended, a prefix
            // without anything after it, spelled with another registry, blank.
            "toolrun/sandbox:0.1.1",
            "toolrun/sandbox",
            "toolrun/sandbox:0.1.0 ",
            "registry.example.com/toolsx/wc:1",
            "registry.example.com.evil.example/tools/wc:1",
            "registry.example.com/tools/",
            "python",
            "docker.io/library/python:3",
            "ghcr.io/acme/wc:1",
            "",
        ] {
            assert!(!image_allowed(&list, refused), "{refused:?} allowed");
        }
        // The default, an empty list, allows nothing.
        assert!(!image_allowed(&[], "toolrun/sandbox:0.1.0"));
        for bad in [
            "*",
            "",
            "a b",
            "registry.example.com*",
            "registry.example.com/*/wc",
            "python:3*",
            "/*",
            "**",
        ] {
            assert!(check_image_pattern(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_kubectl_manifest_parses_and_names_the_tool() {
        let t: Tool = serde_json::from_value(object(good_spec())).unwrap();
        assert_eq!(t.tool_name(), "word_count");
        assert!(t.spec.annotations.read_only);
        assert_eq!(t.spec.implementation.language.as_deref(), Some("python"));
        let mut spec = good_spec();
        spec.as_object_mut().unwrap().remove("name");
        let t: Tool = serde_json::from_value(object(spec)).unwrap();
        assert_eq!(t.tool_name(), "word-count");
        assert!(t.ready().is_none());
    }
}
