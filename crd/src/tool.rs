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
/// `sandbox.kubernetes.toolImages`): an image reference (`toolrun/sandbox:0.1.0`,
/// `registry.example.com/tools/wc@sha256:...`), or a prefix ending in `/*` (every image
/// under a registry or repository path), `:*` (every tag of one repository) or `@*` (every
/// digest of one repository). Nothing else: a bare `*`, or `registry.example.com*` (which
/// would also match `registry.example.com.evil.example/...`), is refused, and so is an
/// entry that is no image reference (`Python:3`, `a//b`).
pub fn check_image_pattern(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() || pattern.len() > 512 || pattern.contains(char::is_whitespace) {
        return Err(format!(
            "{pattern:?} is not an image reference (1-512 characters, no spaces)"
        ));
    }
    match pattern.find('*') {
        None => ImagePattern::parse(pattern).map(drop),
        Some(i)
            if i + 1 == pattern.len()
                && i >= 2
                && matches!(pattern.as_bytes()[i - 1], b'/' | b':' | b'@') =>
        {
            ImagePattern::parse(pattern).map(drop)
        }
        Some(_) => Err(format!(
            "{pattern:?}: `*` may only end a prefix, after `/`, `:` or `@` \
             (e.g. registry.example.com/tools/*, toolrun/sandbox:*)"
        )),
    }
}

/// Whether `image` is allowed by `patterns` ([`check_image_pattern`]'s forms). Both sides
/// are compared in the normal form Docker and containerd pull by
/// ([`normalize_image`]: `python:3` is `docker.io/library/python:3`), so an entry matches
/// however either is spelled: equal to an entry, or under a prefix entry (`/*`: the
/// registry or repository path; `:*`: any tag of that repository; `@*`: any digest of it).
/// A malformed image or entry matches nothing; an empty list allows nothing.
pub fn image_allowed(patterns: &[String], image: &str) -> bool {
    let Ok(image) = normalize_image(image) else {
        return false;
    };
    patterns
        .iter()
        .filter_map(|p| ImagePattern::parse(p).ok())
        .any(|p| match p {
            ImagePattern::Exact(entry) => entry == image,
            ImagePattern::Prefix(prefix) => {
                image.len() > prefix.len() && image.starts_with(&prefix)
            }
        })
}

/// An allow-list entry in normal form.
#[derive(Debug, PartialEq, Eq)]
enum ImagePattern {
    /// One image ([`normalize_image`]).
    Exact(String),
    /// Images whose normal form starts with this: `domain/path/` (`/*`),
    /// `domain/path:` (`:*`) or `domain/path[:tag]@` (`@*`).
    Prefix(String),
}

impl ImagePattern {
    fn parse(pattern: &str) -> Result<Self, String> {
        let bad = |why: String| format!("{pattern:?} is not an image reference: {why}");
        if let Some(path) = pattern.strip_suffix("/*") {
            // What precedes `/*` is followed by more components, so its first component is
            // a registry when it looks like one, as in an image (`acme/*` is Docker Hub's
            // `docker.io/acme/*`; `docker.io/*` and `index.docker.io/*` are all of it).
            let (domain, path) = split_domain(path, true);
            let domain = check_domain(domain).map_err(bad)?;
            if !path.is_empty() {
                check_path(path).map_err(bad)?;
            }
            let sep = if path.is_empty() { "" } else { "/" };
            return Ok(ImagePattern::Prefix(format!("{domain}/{path}{sep}")));
        }
        if let Some(name) = pattern.strip_suffix(":*") {
            let r = Reference::parse(name).map_err(bad)?;
            if r.tag.is_some() || r.digest.is_some() {
                return Err(bad(
                    "`:*` follows a repository, without a tag or digest".into()
                ));
            }
            return Ok(ImagePattern::Prefix(format!("{}/{}:", r.domain, r.path)));
        }
        if let Some(name) = pattern.strip_suffix("@*") {
            let r = Reference::parse(name).map_err(bad)?;
            if r.digest.is_some() {
                return Err(bad("`@*` follows a repository, without a digest".into()));
            }
            let tag = r.tag.map_or_else(String::new, |t| format!(":{t}"));
            return Ok(ImagePattern::Prefix(format!(
                "{}/{}{tag}@",
                r.domain, r.path
            )));
        }
        Ok(ImagePattern::Exact(
            Reference::parse(pattern).map_err(bad)?.normal(),
        ))
    }
}

/// `image` in the normal form Docker and containerd resolve it to (distribution's
/// `ParseNormalizedNamed` with the default tag): a name without a registry is on
/// `docker.io` (`index.docker.io` is the same), a one-component Docker Hub name is under
/// `library/`, and a reference with neither tag nor digest means `:latest`. So
/// `python:3`, `docker.io/python:3`, `index.docker.io/library/python:3` and
/// `docker.io/library/python:3` are one image. Registry names are case-insensitive and
/// lowercased; repository paths must already be lowercase, as Docker requires.
pub fn normalize_image(image: &str) -> Result<String, String> {
    Reference::parse(image)
        .map(|r| r.normal())
        .map_err(|why| format!("{image:?} is not an image reference: {why}"))
}

/// A parsed image reference: `[domain/]path[:tag][@digest]`, registry defaults applied.
#[derive(Debug)]
struct Reference<'a> {
    domain: String,
    path: String,
    tag: Option<&'a str>,
    digest: Option<&'a str>,
}

/// Docker Hub, as references name it.
const DOCKER_HUB: &str = "docker.io";
/// Docker Hub's legacy name, the same registry.
const DOCKER_HUB_LEGACY: &str = "index.docker.io";
/// The longest repository name distribution accepts.
const MAX_NAME_LEN: usize = 255;

impl<'a> Reference<'a> {
    fn parse(text: &'a str) -> Result<Self, String> {
        if text.is_empty() || text.len() > 512 || text.contains(char::is_whitespace) {
            return Err("1-512 characters, no spaces".into());
        }
        let (rest, digest) = match text.split_once('@') {
            Some((rest, digest)) => (rest, Some(check_digest(digest)?)),
            None => (text, None),
        };
        // A tag follows the last `:` after the last `/` (before it, `:` is a port).
        let after_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[after_slash..].rfind(':') {
            Some(i) => {
                let (name, tag) = rest.split_at(after_slash + i);
                (name, Some(check_tag(&tag[1..])?))
            }
            None => (rest, None),
        };
        if name.len() > MAX_NAME_LEN {
            return Err(format!("the name is longer than {MAX_NAME_LEN} characters"));
        }
        let (domain, path) = split_domain(name, false);
        let domain = check_domain(domain)?;
        check_path(path)?;
        let path = if domain == DOCKER_HUB && !path.contains('/') {
            format!("library/{path}")
        } else {
            path.to_string()
        };
        Ok(Reference {
            domain,
            path,
            tag,
            digest,
        })
    }

    /// `domain/path[:tag][@digest]`, `:latest` when neither is given.
    fn normal(&self) -> String {
        let mut s = format!("{}/{}", self.domain, self.path);
        match (self.tag, self.digest) {
            (None, None) => s.push_str(":latest"),
            (tag, digest) => {
                if let Some(t) = tag {
                    s.push(':');
                    s.push_str(t);
                }
                if let Some(d) = digest {
                    s.push('@');
                    s.push_str(d);
                }
            }
        }
        s
    }
}

/// The registry part of `name` and the rest (distribution's `splitDockerDomain`): the
/// first component is a registry when more follow (or `more` says they will) and it has a
/// `.` or `:`, is `localhost`, or has an uppercase letter; otherwise the registry is Docker
/// Hub.
fn split_domain(name: &str, more: bool) -> (&str, &str) {
    let (first, rest) = match name.split_once('/') {
        Some((first, rest)) => (first, rest),
        None if more => (name, ""),
        None => return (DOCKER_HUB, name),
    };
    if first.contains(['.', ':']) || first == "localhost" || first.contains(char::is_uppercase) {
        (first, rest)
    } else {
        (DOCKER_HUB, name)
    }
}

/// A registry host (name or `[IPv6]`) with an optional port, lowercased, Docker Hub's
/// legacy name replaced by its own.
fn check_domain(domain: &str) -> Result<String, String> {
    // `[v6]` or `name`, then `:port` or nothing.
    let host_end = match domain.starts_with('[') {
        true => domain.find(']').map_or(domain.len(), |i| i + 1),
        false => domain.find(':').unwrap_or(domain.len()),
    };
    let (host, port) = domain.split_at(host_end);
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host.split('.').all(|label| {
                    !label.is_empty()
                        && !label.starts_with('-')
                        && !label.ends_with('-')
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                })
        }
    };
    let port_ok = port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    if !host_ok || !port_ok {
        return Err(format!("{domain:?} is not a registry host[:port]"));
    }
    let domain = domain.to_ascii_lowercase();
    Ok(if domain == DOCKER_HUB_LEGACY {
        DOCKER_HUB.into()
    } else {
        domain
    })
}

/// Repository path components: lowercase letters and digits, joined inside a component by
/// one `.`, one or two `_`, or any number of `-`.
fn check_path(path: &str) -> Result<(), String> {
    let component_ok = |c: &str| {
        let b = c.as_bytes();
        let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
        if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
            return false;
        }
        let mut i = 0;
        while i < b.len() {
            if alnum(b[i]) {
                i += 1;
                continue;
            }
            let run = b[i..].iter().take_while(|&&x| !alnum(x)).count();
            let sep = &c[i..i + run];
            if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-')) {
                return false;
            }
            i += run;
        }
        true
    };
    if path.split('/').all(component_ok) {
        Ok(())
    } else {
        Err(format!(
            "{path:?} is not a repository path (lowercase letters and digits, components \
             joined by `/`, separated inside by `.`, `_`, `__` or `-`)"
        ))
    }
}

/// A tag: a letter, digit or `_`, then up to 127 of those, `.` and `-`.
fn check_tag(tag: &str) -> Result<&str, String> {
    let b = tag.as_bytes();
    let word = |x: u8| x.is_ascii_alphanumeric() || x == b'_';
    if !b.is_empty()
        && b.len() <= 128
        && word(b[0])
        && b[1..].iter().all(|&x| word(x) || x == b'.' || x == b'-')
    {
        Ok(tag)
    } else {
        Err(format!("{tag:?} is not a tag"))
    }
}

/// A digest `algorithm:encoded` (OCI's grammar); a `sha256` one is 64 lowercase hex
/// digits, a `sha512` one 128, as registries and runtimes require.
fn check_digest(digest: &str) -> Result<&str, String> {
    let bad = || format!("{digest:?} is not a digest (algorithm:hex, e.g. sha256:<64 hex>)");
    let (algorithm, encoded) = digest.split_once(':').ok_or_else(bad)?;
    let alg_ok = !algorithm.is_empty()
        && algorithm.split(['+', '.', '_', '-']).all(|c| {
            !c.is_empty()
                && c.bytes()
                    .all(|x| x.is_ascii_lowercase() || x.is_ascii_digit())
        });
    let hex = |n: usize| {
        encoded.len() == n
            && encoded
                .bytes()
                .all(|x| x.is_ascii_digit() || (b'a'..=b'f').contains(&x))
    };
    let enc_ok = match algorithm {
        "sha256" => hex(64),
        "sha512" => hex(128),
        _ => {
            !encoded.is_empty()
                && encoded
                    .bytes()
                    .all(|x| x.is_ascii_alphanumeric() || matches!(x, b'=' | b'_' | b'-'))
        }
    };
    if alg_ok && enc_ok {
        Ok(digest)
    } else {
        Err(bad())
    }
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
        let d1 = format!("sha256:{}", "a".repeat(64));
        let d2 = format!("sha256:{}", "b".repeat(64));
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
            "docker.io/toolrun/sandbox:0.1.0",
            "registry.example.com/tools/wc:1",
            &format!("registry.example.com/tools/a/b@{d1}"),
            "python:3.12-slim",
            "docker.io/library/python:3",
            "index.docker.io/library/python:3",
            // No tag is `:latest`, a tag of python.
            "python",
            &format!("ghcr.io/acme/wc@{d1}"),
        ] {
            assert!(image_allowed(&list, allowed), "{allowed} refused");
        }
        for refused in [
            // Another tag, another repository, the registry's name extended, a prefix
            // without anything after it, another registry, not a reference, blank.
            "toolrun/sandbox:0.1.1",
            "toolrun/sandbox",
            "toolrun/sandbox:0.1.0 ",
            "registry.example.com/toolsx/wc:1",
            "registry.example.com.evil.example/tools/wc:1",
            "registry.example.com/tools/",
            "evil.io/library/python:3",
            "ghcr.io/library/python:3",
            "ghcr.io/acme/wc:1",
            &format!("python@{d1}"),
            "registry.example.com/tools/WC:1",
            "",
        ] {
            assert!(!image_allowed(&list, refused), "{refused:?} allowed");
        }
        // The default, an empty list, allows nothing.
        assert!(!image_allowed(&[], "toolrun/sandbox:0.1.0"));
        assert!(!image_allowed(&[], &d2));
        for bad in [
            "*",
            "",
            "a b",
            "registry.example.com*",
            "registry.example.com/*/wc",
            "python:3*",
            "/*",
            "**",
            // Not references: uppercase repository, empty component, bad tag or digest.
            "Python:3",
            "a//b",
            "python:3:*",
            "python:-3",
            "python@sha256:abc",
            &format!("python@{d1}@*"),
            "registry.example.com:port/x",
        ] {
            assert!(check_image_pattern(bad).is_err(), "{bad:?} accepted");
        }
    }

    /// Pairs of references that name one image (Docker's and containerd's defaults), and
    /// pairs that must not.
    #[test]
    fn references_are_compared_in_docker_s_normal_form() {
        let d1 = format!("sha256:{}", "a".repeat(64));
        let d2 = format!("sha256:{}", "b".repeat(64));
        let same = [
            ("python:3", "docker.io/library/python:3"),
            ("python:3", "index.docker.io/library/python:3"),
            ("python:3", "docker.io/python:3"),
            ("python", "python:latest"),
            ("python", "docker.io/library/python:latest"),
            ("acme/tool:1", "docker.io/acme/tool:1"),
            ("acme/tool:1", "index.docker.io/acme/tool:1"),
            (
                "REGISTRY.example.com/tools/wc:1",
                "registry.example.com/tools/wc:1",
            ),
            ("localhost:5000/wc", "localhost:5000/wc:latest"),
            ("localhost/wc:1", "localhost/wc:1"),
            ("[::1]:5000/wc:1", "[::1]:5000/wc:1"),
            (
                &format!("python@{d1}"),
                &format!("docker.io/library/python@{d1}"),
            ),
            (
                &format!("python:3@{d1}"),
                &format!("docker.io/library/python:3@{d1}"),
            ),
        ];
        for (a, b) in same {
            assert_eq!(normalize_image(a).unwrap(), normalize_image(b).unwrap());
            assert!(image_allowed(&[a.to_string()], b), "entry {a} refused {b}");
            assert!(image_allowed(&[b.to_string()], a), "entry {b} refused {a}");
        }
        assert_eq!(
            normalize_image("python:3").unwrap(),
            "docker.io/library/python:3"
        );
        let different = [
            // Another registry with the same path, Docker Hub's namespace spelled by another.
            ("python:3", "evil.io/library/python:3"),
            ("python:3", "evil.io/python:3"),
            ("python:3", "library.io/python:3"),
            // Another tag, a tag's extension, the default tag against a named one.
            ("python:3", "python:3.12"),
            ("python:3", "python"),
            ("python:latest", "python:Latest"),
            // A digest is not a tag, and two digests are two images.
            ("python:3", &format!("python@{d1}")),
            (&format!("python@{d1}"), &format!("python:3@{d1}")),
            (&format!("python@{d1}"), &format!("python@{d2}")),
            // Namespaces and registries: `acme/x` is Docker Hub's, not a registry `acme`.
            ("acme/tool:1", "acme.io/tool:1"),
            ("library/tool:1", "tool:2"),
            ("localhost:5000/wc", "localhost:5001/wc"),
            ("localhost:5000/wc", "docker.io/library/localhost:5000"),
            ("registry.example.com/wc:1", "registry.example.com:443/wc:1"),
        ];
        for (a, b) in different {
            assert!(!image_allowed(&[a.to_string()], b), "entry {a} allowed {b}");
            assert!(!image_allowed(&[b.to_string()], a), "entry {b} allowed {a}");
        }
    }

    /// Prefix entries keep their meaning in the normal form: `/*` a registry or path, `:*`
    /// one repository's tags, `@*` its digests.
    #[test]
    fn prefix_entries_are_normalised_too() {
        let d1 = format!("sha256:{}", "a".repeat(64));
        let cases: &[(&str, &[&str], &[&str])] = &[
            (
                "docker.io/*",
                &["python:3", "acme/tool", "index.docker.io/x/y:1"],
                &["ghcr.io/acme/tool:1", "docker.io.evil.io/x:1"],
            ),
            (
                "index.docker.io/*",
                &["python:3", "docker.io/acme/tool:1"],
                &["ghcr.io/python:3"],
            ),
            (
                "library/*",
                &[
                    "python:3",
                    "docker.io/library/busybox",
                    &format!("alpine@{d1}"),
                ],
                &["acme/python:3", "evil.io/library/python:3"],
            ),
            (
                "acme/*",
                &[
                    "acme/tool:1",
                    "docker.io/acme/a/b:2",
                    "index.docker.io/acme/tool",
                ],
                &["acme:1", "acmex/tool:1", "acme.io/tool:1"],
            ),
            (
                "registry.example.com/*",
                &["registry.example.com/wc:1", "REGISTRY.EXAMPLE.COM/a/b"],
                &[
                    "registry.example.com.evil.io/wc:1",
                    "registry.example.com:5000/wc:1",
                ],
            ),
            (
                "docker.io/library/python:*",
                &["python:3", "python", "index.docker.io/python:3.12"],
                &[&format!("python@{d1}"), "pythonx:3", "acme/python:3"],
            ),
            (
                "python@*",
                &[
                    &format!("python@{d1}"),
                    &format!("docker.io/library/python@{d1}"),
                ],
                &["python:3", "python", &format!("acme/python@{d1}")],
            ),
        ];
        for (pattern, allowed, refused) in cases {
            check_image_pattern(pattern).unwrap();
            let list = [pattern.to_string()];
            for image in *allowed {
                assert!(image_allowed(&list, image), "{pattern} refused {image}");
            }
            for image in *refused {
                assert!(!image_allowed(&list, image), "{pattern} allowed {image}");
            }
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
