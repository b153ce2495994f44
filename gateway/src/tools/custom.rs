//! Custom tools: tools a platform team declares without writing Rust, in the configuration
//! file (`custom_tools`) or as `Tool` resources on Kubernetes ([`super::custom_kube`]).
//!
//! A declaration names the tool, describes it, gives its input (and optionally output) JSON
//! Schema, its behaviour hints and an implementation: a script in one of the sandbox's
//! languages, or (kubernetes backend) a container image and the command run in it. A call
//! runs the script exactly as run_code runs a program (the same [`SandboxPool::run`]:
//! limits, isolation, verdicts, the session's workspace), with the validated arguments as
//! JSON on stdin; its stdout must be one JSON value that passes the output schema. An image
//! tool runs the same way in a pod of its own whose run container is the image (the runner
//! copied in executes the command): only images `sandbox.kubernetes.toolImages` names, and
//! never in a session's pod (a call in a session runs without the workspace).
//!
//! Declarations are checked one by one: a bad one is refused with its reason (logged, in
//! `/readyz`, in the `Tool` resource's status) while the others serve.
//! [`super::custom_reload::CustomTools`] owns the declared set and swaps the executor's
//! registry whole on each change, so calls in flight finish on the definition they started
//! with.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::run_code::{CodeRun, ImageCommand, LanguageArg, RunCodeOutput, SandboxPool};
use crate::approval::{ApprovalAsk, ApprovalKind};
use crate::config::{Limits, LimitsOverride, MAX_TIMEOUT_MS, MIN_TIMEOUT_MS, SandboxConfig};
use crate::error::{ErrorCode, ToolError};
use crate::tool::{
    ApprovalPolicy, CallContext, Category, Determinism, Hints, SideEffect, Tool, ToolMetadata,
};

/// Largest script, in bytes (run_code's `code` bound).
pub const MAX_SCRIPT_BYTES: usize = 50_000;
/// Largest description, in bytes (providers truncate or refuse longer ones).
pub const MAX_DESCRIPTION_BYTES: usize = 4_096;
/// Most custom tools served at once.
pub const MAX_CUSTOM_TOOLS: usize = 256;
/// Longest image reference (the Tool and ToolRun resources' bound).
pub const MAX_IMAGE_BYTES: usize = 512;
/// Most elements of an image's command (the ToolRun resource's bound).
pub const MAX_COMMAND_ELEMENTS: usize = 64;
/// Longest element of an image's command, in characters (the ToolRun resource's bound).
pub const MAX_COMMAND_CHARS: usize = 4096;
/// How much of stderr a failed call's message quotes.
const STDERR_TAIL: usize = 1_000;

/// One declaration, as written in the configuration's `custom_tools` list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomToolSpec {
    /// The tool's id, what models call: `^[a-zA-Z0-9_-]{1,64}$`, unique among all tools.
    pub name: String,
    /// Display name (default: the name).
    #[serde(default)]
    pub title: Option<String>,
    /// What the tool does, written for a model.
    pub description: String,
    /// JSON Schema of the arguments: an object schema with `properties`.
    pub input_schema: Value,
    /// JSON Schema of the output (default: any JSON object).
    #[serde(default)]
    pub output_schema: Option<Value>,
    /// Behaviour hints: `read_only`, `destructive` (asks for approval in a session),
    /// `idempotent`, `open_world`.
    #[serde(default)]
    pub annotations: Hints,
    /// Category listed by ListTools (default `utility`).
    #[serde(default)]
    pub category: Option<Category>,
    /// Longest a call may take, 100..=60000 ms (default `sandbox.default_timeout_seconds`).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Sandbox limits over `sandbox.limits`.
    #[serde(default)]
    pub limits: Option<LimitsOverride>,
    /// What runs.
    pub implementation: Implementation,
}

/// How a custom tool runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Implementation {
    /// A language of the sandbox (python, javascript, bash or one of `sandbox.languages`).
    #[serde(default)]
    pub language: Option<String>,
    /// The script's source.
    #[serde(default)]
    pub script: Option<String>,
    /// A file holding the script, relative to the configuration file's directory.
    #[serde(default)]
    pub script_file: Option<PathBuf>,
    /// A container image (kubernetes backend only; one `sandbox.kubernetes.toolImages`
    /// names).
    #[serde(default)]
    pub image: Option<String>,
    /// The program run in `image` and its arguments: an absolute path or a name on the
    /// sandbox's PATH (`/usr/local/bin:/usr/bin:/bin`); it reads the arguments on stdin.
    #[serde(default)]
    pub command: Vec<String>,
}

/// What building a custom tool needs from the gateway.
#[derive(Clone)]
pub struct BuildContext {
    /// The sandbox runs go to (`None` with `--no-sandbox`: every custom tool is refused).
    pub pool: Option<Arc<SandboxPool>>,
    /// The sandbox settings (languages, default limits and timeout).
    pub sandbox: SandboxConfig,
}

/// A custom tool, ready to call.
pub struct CustomTool {
    metadata: ToolMetadata,
    hints: Hints,
    input_schema: Value,
    output_schema: Value,
    output_validator: jsonschema::Validator,
    /// The script's language and source (empty for an image tool).
    language: String,
    script: String,
    /// An image tool's image and command.
    image: Option<ImageCommand>,
    pool: Arc<SandboxPool>,
    limits: Limits,
    timeout: Duration,
}

impl CustomTool {
    /// Checks a declaration and builds the tool; `base_dir` resolves `script_file`. The
    /// error says what is wrong, naming the key.
    pub fn build(
        spec: CustomToolSpec,
        base_dir: Option<&Path>,
        cx: &BuildContext,
    ) -> Result<CustomTool, String> {
        if !crate::validation::valid_name(&spec.name) {
            return Err(format!(
                "name {:?} must match ^[a-zA-Z0-9_-]{{1,64}}$",
                spec.name
            ));
        }
        if spec.description.trim().is_empty() {
            return Err("description: must say what the tool does".into());
        }
        if spec.description.len() > MAX_DESCRIPTION_BYTES {
            return Err(format!(
                "description: {} bytes, at most {MAX_DESCRIPTION_BYTES}",
                spec.description.len()
            ));
        }
        let h = spec.annotations;
        if h.read_only && h.destructive {
            return Err("annotations: a tool cannot be both read_only and destructive".into());
        }
        crate::validation::validate_definition(&spec.name, &spec.input_schema)
            .map_err(|e| format!("input_schema: {e}"))?;
        let output_schema = spec
            .output_schema
            .unwrap_or_else(|| json!({"type": "object"}));
        let output_validator = crate::validation::compile(&spec.name, "output", &output_schema)
            .map_err(|e| format!("output_schema: {e}"))?;
        let timeout_ms = spec
            .timeout_ms
            .unwrap_or(cx.sandbox.default_timeout_seconds * 1000);
        if !(MIN_TIMEOUT_MS..=MAX_TIMEOUT_MS).contains(&timeout_ms) {
            return Err(format!(
                "timeout_ms: {timeout_ms} is out of range {MIN_TIMEOUT_MS}..={MAX_TIMEOUT_MS}"
            ));
        }
        let limits = cx.sandbox.limits.merged(spec.limits.as_ref());
        limits.validate("limits").map_err(|e| e.to_string())?;
        let (language, script, image) = implementation(spec.implementation, base_dir, cx)?;
        let Some(pool) = cx.pool.clone() else {
            return Err("the gateway runs without a sandbox (--no-sandbox)".into());
        };
        let read_only = h.read_only;
        let metadata = ToolMetadata {
            name: spec.title.unwrap_or_else(|| spec.name.clone()).into(),
            id: spec.name.into(),
            description: spec.description.into(),
            version: "1.0.0",
            category: spec.category.unwrap_or(Category::Utility),
            sandbox_required: true,
            side_effect: if read_only {
                SideEffect::Pure
            } else {
                SideEffect::Impure
            },
            determinism: if h.idempotent && !h.open_world {
                Determinism::Deterministic
            } else {
                Determinism::NonDeterministic
            },
            required_capabilities: &[],
            approval: if read_only {
                ApprovalPolicy::Never
            } else if h.destructive {
                ApprovalPolicy::Always
            } else {
                ApprovalPolicy::Conditional
            },
            max_memory_bytes: Some(limits.memory_mb << 20),
        };
        Ok(CustomTool {
            metadata,
            hints: h,
            input_schema: spec.input_schema,
            output_schema,
            output_validator,
            language,
            script,
            image,
            pool,
            limits,
            timeout: Duration::from_millis(timeout_ms),
        })
    }

    /// Longest a call may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The typed failure for stdout that is not one JSON value, or breaks the output schema.
    fn output(&self, out: RunCodeOutput) -> Result<Value, ToolError> {
        let id = &self.metadata.id;
        let text = out.stdout.trim();
        let value: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                let why = if text.is_empty() {
                    "printed nothing on stdout".to_string()
                } else {
                    format!("printed output that is not JSON ({e})")
                };
                return Err(ToolError::new(
                    ErrorCode::ExecutionError,
                    format!("custom tool {id:?} {why}: it must print one JSON value"),
                )
                .with_details(json!({"reason": "OUTPUT_NOT_JSON"}))
                .with_output(serde_json::to_value(&out).expect("output serialises")));
            }
        };
        let errors: Vec<Value> = self
            .output_validator
            .iter_errors(&value)
            .take(8)
            .map(|e| {
                let path = e.instance_path().to_string();
                json!({
                    "path": if path.is_empty() { "/".to_string() } else { path },
                    "message": e.to_string(),
                })
            })
            .collect();
        if errors.is_empty() {
            return Ok(value);
        }
        let summary: Vec<String> = errors
            .iter()
            .map(|e| format!("{}: {}", e["path"].as_str().unwrap_or("/"), e["message"]))
            .collect();
        Err(ToolError::new(
            ErrorCode::ExecutionError,
            format!(
                "custom tool {id:?} printed output that does not match its output schema: {}",
                summary.join("; ")
            ),
        )
        .with_details(json!({"reason": "OUTPUT_SCHEMA", "errors": errors}))
        .with_output(value))
    }
}

/// The language and script of an implementation, or its image and command, checked
/// against the sandbox.
fn implementation(
    i: Implementation,
    base_dir: Option<&Path>,
    cx: &BuildContext,
) -> Result<(String, String, Option<ImageCommand>), String> {
    if i.image.is_some() || !i.command.is_empty() {
        let image = image_implementation(i, cx)?;
        return Ok((String::new(), String::new(), Some(image)));
    }
    let Some(language) = i.language else {
        return Err("implementation.language: missing (python, javascript, bash, ...)".into());
    };
    let names = cx.sandbox.language_names();
    if !names.contains(&language) {
        return Err(format!(
            "implementation.language: {language:?} is not a sandbox language; configured: {}",
            names.join(", ")
        ));
    }
    let kubernetes = cx
        .pool
        .as_ref()
        .is_some_and(|p| p.sandbox().info().backend == "kubernetes");
    if kubernetes && !crate::config::BUILTIN_LANGUAGES.contains(&language.as_str()) {
        return Err(format!(
            "implementation.language: {language:?} is configured for the local backend only"
        ));
    }
    let script = match (i.script, i.script_file) {
        (Some(s), None) => s,
        (None, Some(file)) => {
            let path = match base_dir {
                Some(dir) if file.is_relative() => dir.join(&file),
                _ => file,
            };
            std::fs::read_to_string(&path).map_err(|e| {
                format!(
                    "implementation.script_file: cannot read {}: {e}",
                    path.display()
                )
            })?
        }
        (Some(_), Some(_)) => {
            return Err("implementation: give script or script_file, not both".into());
        }
        (None, None) => return Err("implementation: script or script_file is missing".into()),
    };
    if script.trim().is_empty() {
        return Err("implementation.script: empty".into());
    }
    if script.len() > MAX_SCRIPT_BYTES {
        return Err(format!(
            "implementation.script: {} bytes, at most {MAX_SCRIPT_BYTES}",
            script.len()
        ));
    }
    Ok((language, script, None))
}

/// An image implementation: the kubernetes backend only, an image `toolImages` allows, a
/// command the ToolRun resource holds. (Without a sandbox at all, `--no-sandbox` refuses
/// every custom tool after these checks.)
fn image_implementation(i: Implementation, cx: &BuildContext) -> Result<ImageCommand, String> {
    if i.language.is_some() || i.script.is_some() || i.script_file.is_some() {
        return Err(
            "implementation: give language and script, or image and command, not both".into(),
        );
    }
    let Some(image) = i.image else {
        return Err("implementation.image: missing (the image the command runs in)".into());
    };
    if i.command.is_empty() {
        return Err(
            "implementation.command: missing (the program run in the image, and its arguments)"
                .into(),
        );
    }
    if let Some(pool) = &cx.pool
        && pool.sandbox().info().backend != "kubernetes"
    {
        return Err(format!(
            "implementation.image: container images run on the kubernetes backend only (a Tool \
             resource), this gateway's backend is {}: declare a language and a script",
            pool.sandbox().info().backend
        ));
    }
    check_image(&image, &i.command, &cx.sandbox.kubernetes.tool_images)?;
    Ok(ImageCommand {
        image,
        command: i.command,
    })
}

/// An image tool's image and command, against the allow-list (`toolImages`) and the
/// ToolRun resource's bounds.
pub fn check_image(image: &str, command: &[String], allowed: &[String]) -> Result<(), String> {
    if image.is_empty() || image.len() > MAX_IMAGE_BYTES || image.contains(char::is_whitespace) {
        return Err(format!(
            "implementation.image: {image:?} is not an image reference (1-{MAX_IMAGE_BYTES} \
             characters, no spaces)"
        ));
    }
    if command.len() > MAX_COMMAND_ELEMENTS {
        return Err(format!(
            "implementation.command: {} elements, at most {MAX_COMMAND_ELEMENTS}",
            command.len()
        ));
    }
    if command.first().is_none_or(|p| p.trim().is_empty()) {
        return Err("implementation.command[0]: the program is empty".into());
    }
    if let Some((n, c)) = command
        .iter()
        .enumerate()
        .find(|(_, c)| c.chars().count() > MAX_COMMAND_CHARS)
    {
        return Err(format!(
            "implementation.command[{n}]: {} characters, at most {MAX_COMMAND_CHARS}",
            c.chars().count()
        ));
    }
    if !toolrun_crd::tool::image_allowed(allowed, image) {
        let list = if allowed.is_empty() {
            "none".to_string()
        } else {
            allowed.join(", ")
        };
        return Err(format!(
            "implementation.image: {image:?} is not allowed: sandbox.kubernetes.toolImages \
             ({list}) does not name it (the chart's sandbox.toolImages)"
        ));
    }
    Ok(())
}

#[async_trait]
impl Tool for CustomTool {
    fn metadata(&self) -> &ToolMetadata {
        &self.metadata
    }

    fn input_schema(&self) -> &Value {
        &self.input_schema
    }

    fn output_schema(&self) -> &Value {
        &self.output_schema
    }

    fn default_timeout_ms(&self) -> u64 {
        self.timeout.as_millis() as u64
    }

    fn hints(&self) -> Option<Hints> {
        Some(self.hints)
    }

    async fn approval(
        &self,
        args: &Value,
        _ctx: &CallContext,
    ) -> Result<Option<ApprovalAsk>, ToolError> {
        if self.hints.read_only {
            return Ok(None);
        }
        let (kind, what) = if self.hints.destructive {
            (ApprovalKind::Destructive, "destructive")
        } else if self.image.is_some() {
            (ApprovalKind::Execute, "runs its container image")
        } else {
            (ApprovalKind::Execute, "runs in the workspace")
        };
        let mut ask = crate::tool::plain_ask(&self.metadata, args);
        ask.kind = kind;
        ask.reason = format!("{} ({what})", ask.reason);
        Ok(Some(ask))
    }

    async fn call(&self, args: Value, ctx: &CallContext) -> Result<Value, ToolError> {
        let run = CodeRun {
            language: LanguageArg(self.language.clone().into()),
            code: self.script.clone(),
            args: Vec::new(),
            env: BTreeMap::new(),
            stdin: args.to_string(),
            timeout: self.timeout,
            tool: self.metadata.id.clone(),
            workdir: None,
            image: self.image.clone(),
        };
        match self.pool.run(run, &self.limits, ctx).await {
            Ok(out) => self.output(out),
            Err(mut e) => {
                // A failing script says why on stderr: the model (and the person reading
                // the audit) gets its tail in the message.
                if e.code == ErrorCode::ExecutionError
                    && let Some(stderr) = e
                        .output
                        .as_ref()
                        .and_then(|o| o["stderr"].as_str())
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                {
                    let mut start = stderr.len().saturating_sub(STDERR_TAIL);
                    while !stderr.is_char_boundary(start) {
                        start += 1;
                    }
                    e.message = format!("{}: {}", e.message, &stderr[start..]);
                }
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::custom_reload::from_config;

    fn cx() -> BuildContext {
        BuildContext {
            pool: None,
            sandbox: SandboxConfig::default(),
        }
    }

    fn spec(patch: Value) -> Result<CustomTool, String> {
        let mut v = json!({
            "name": "t",
            "description": "A test tool.",
            "input_schema": {"type": "object", "properties": {"a": {"type": "string"}}},
            "implementation": {"language": "python", "script": "print('{}')"},
        });
        json_patch(&mut v, patch);
        let d = from_config(&[v], None).remove(0);
        d.spec.and_then(|s| CustomTool::build(s, None, &cx()))
    }

    fn json_patch(v: &mut Value, patch: Value) {
        if let (Value::Object(a), Value::Object(b)) = (v, patch) {
            for (k, x) in b {
                if x.is_null() {
                    a.remove(&k);
                } else if a.get(&k).is_some_and(Value::is_object) && x.is_object() {
                    json_patch(a.get_mut(&k).unwrap(), x);
                } else {
                    a.insert(k, x);
                }
            }
        }
    }

    fn refused(patch: Value, why: &str) {
        let e = spec(patch.clone())
            .err()
            .unwrap_or_else(|| panic!("{patch} built"));
        assert!(e.contains(why), "{patch}: {e}");
    }

    #[test]
    fn declarations_are_checked_and_the_reason_names_the_key() {
        // The control: a good declaration passes every check up to the sandbox, which
        // this test has none of.
        refused(json!({}), "--no-sandbox");
        refused(json!({"name": "has space"}), "must match");
        refused(json!({"description": " "}), "description");
        refused(json!({"input_schema": {"type": "string"}}), "input_schema");
        refused(
            json!({"output_schema": {"type": "nope"}}),
            "output_schema: tool t: invalid output schema",
        );
        refused(
            json!({"annotations": {"read_only": true, "destructive": true}}),
            "read_only and destructive",
        );
        refused(
            json!({"annotations": {"readonly": true}}),
            "custom_tools[0].annotations",
        );
        refused(json!({"timeout_ms": 99}), "timeout_ms: 99");
        refused(json!({"limits": {"memory_mb": 1}}), "limits.memory_mb");
        refused(
            json!({"implementation": {"language": "cobol"}}),
            "not a sandbox language",
        );
        refused(
            json!({"implementation": {"language": null}}),
            "language: missing",
        );
        refused(
            json!({"implementation": {"script_file": "x.py"}}),
            "not both",
        );
        refused(
            json!({"implementation": {"script": null, "script_file": "/nonexistent/x.py"}}),
            "cannot read /nonexistent/x.py",
        );
        refused(json!({"implementation": {"script": ""}}), "empty");
        refused(
            json!({"implementation": {"script": "x".repeat(MAX_SCRIPT_BYTES + 1)}}),
            "at most 50000",
        );
        refused(
            json!({"implementation": {"image": "busybox", "command": ["true"]}}),
            "give language and script, or image and command, not both",
        );
        refused(
            json!({"implementation": {"lang": "python"}}),
            "custom_tools[0].implementation.lang: unknown field `lang`",
        );
        refused(json!({"name": null}), "missing field `name`");
    }

    #[test]
    fn placeholder_names_for_unnamed_entries() {
        let d = from_config(&[json!({"description": "x"}), json!(7)], None);
        assert_eq!(d[0].name, "custom_tools[0]");
        assert_eq!(d[1].name, "custom_tools[1]");
        assert!(
            d[1].spec
                .as_ref()
                .unwrap_err()
                .starts_with("custom_tools[1]: invalid type")
        );
    }
}

#[cfg(test)]
mod example_tests {
    use super::*;
    use crate::tools::custom_reload::from_config;

    #[test]
    fn the_example_file_declares_a_valid_custom_tool() {
        let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
        let c = crate::config::Config::load(&dir.join("toolrun.example.yaml")).unwrap();
        let declared = from_config(&c.custom_tools, Some(dir));
        assert_eq!(declared.len(), 1);
        let spec = declared[0].spec.clone().unwrap();
        assert_eq!(spec.name, "word_count");
        let cx = BuildContext {
            pool: None,
            sandbox: c.sandbox.clone(),
        };
        // Every check passes; only this test's missing sandbox refuses it.
        let e = CustomTool::build(spec, Some(dir), &cx).err().unwrap();
        assert!(e.contains("--no-sandbox"), "{e}");
    }
}

#[cfg(test)]
mod image_tests {
    use std::sync::Mutex;

    use tokio::sync::mpsc;
    use tokio_util::sync::CancellationToken;
    use toolrun_runner::{Language, RunRecord, Verdict};

    use super::*;
    use crate::sandbox::{Sandbox, SandboxError, SandboxInfo, SandboxRun};
    use crate::tool::StreamChunk;
    use crate::tools::custom_reload::from_config;

    const IMAGE: &str = "toolrun/sandbox:0.1.0";
    const SCRIPT: &str = "import json,sys; a=json.load(sys.stdin); print(json.dumps({'words': len(a['text'].split())}))";

    /// A backend that records what it is asked to run and answers `stdout`.
    struct Recording {
        backend: &'static str,
        stdout: &'static str,
        runs: Mutex<Vec<SandboxRun>>,
    }

    #[async_trait]
    impl Sandbox for Recording {
        fn info(&self) -> SandboxInfo {
            SandboxInfo {
                backend: self.backend.into(),
                mechanisms: Vec::new(),
            }
        }

        async fn run(
            &self,
            run: SandboxRun,
            _stream: Option<mpsc::Sender<StreamChunk>>,
            _cancel: CancellationToken,
        ) -> Result<RunRecord, SandboxError> {
            self.runs.lock().unwrap().push(run);
            Ok(RunRecord {
                version: toolrun_runner::PROTOCOL_VERSION,
                verdict: Verdict::Ok,
                exit_code: 0,
                signal: None,
                stdout: self.stdout.into(),
                stderr: String::new(),
                stdout_truncated: false,
                stderr_truncated: false,
                timed_out: false,
                duration_ms: 5,
                message: String::new(),
                artifacts: None,
            })
        }
    }

    fn context(backend: &'static str, allowed: &[&str]) -> (BuildContext, Arc<Recording>) {
        let sandbox = Arc::new(Recording {
            backend,
            stdout: "{\"words\": 2}\n",
            runs: Mutex::new(Vec::new()),
        });
        let mut config = SandboxConfig::default();
        config.kubernetes.tool_images = allowed.iter().map(|s| s.to_string()).collect();
        let pool = SandboxPool::new(
            sandbox.clone(),
            config.clone(),
            Arc::new(crate::metrics::Metrics::new()),
        );
        (
            BuildContext {
                pool: Some(Arc::new(pool)),
                sandbox: config,
            },
            sandbox,
        )
    }

    fn declare(implementation: Value, cx: &BuildContext) -> Result<CustomTool, String> {
        let v = json!({
            "name": "word_count",
            "description": "Counts words.",
            "input_schema": {"type": "object", "properties": {"text": {"type": "string"}},
                             "required": ["text"]},
            "output_schema": {"type": "object", "properties": {"words": {"type": "integer"}},
                              "required": ["words"]},
            "annotations": {"read_only": true},
            "implementation": implementation,
        });
        let d = from_config(&[v], None).remove(0);
        d.spec.and_then(|s| CustomTool::build(s, None, cx))
    }

    fn image_impl(image: &str) -> Value {
        json!({"image": image, "command": ["python3", "-c", SCRIPT]})
    }

    #[tokio::test]
    async fn an_image_tool_runs_its_command_in_its_image_with_the_arguments_on_stdin() {
        let (cx, sandbox) = context("kubernetes", &["toolrun/sandbox:*"]);
        let tool = declare(image_impl(IMAGE), &cx).unwrap();
        let ctx = CallContext::with_timeout("call-img", Duration::from_secs(10));
        let out = tool.call(json!({"text": "a b"}), &ctx).await.unwrap();
        assert_eq!(out, json!({"words": 2}));
        let run = &sandbox.runs.lock().unwrap()[0].clone();
        assert_eq!(run.image.as_deref(), Some(IMAGE));
        assert_eq!(run.spec.language, Language::Exec);
        assert_eq!(run.spec.interpreter, "python3");
        assert_eq!(run.spec.args, ["-c", SCRIPT]);
        assert_eq!(run.spec.code, "");
        assert_eq!(run.spec.stdin, r#"{"text":"a b"}"#);
        assert_eq!(run.spec.workdir, "/tmp");
        assert_eq!(
            (run.session.as_deref(), run.workspace.as_ref()),
            (None, None)
        );
        assert_eq!(run.tool, "word_count");
        // The ToolRun the kubernetes backend creates for it: image and command, the
        // arguments as stdin, no language.
        let tr = crate::sandbox::kubernetes::convert::tool_run(
            "run-1",
            run,
            &crate::config::KubernetesConfig::default(),
        )
        .unwrap();
        assert_eq!(tr.spec.image.as_deref(), Some(IMAGE));
        assert_eq!(tr.spec.command, ["python3", "-c", SCRIPT]);
        assert_eq!(tr.spec.stdin, r#"{"text":"a b"}"#);
        assert_eq!((tr.spec.language.as_str(), tr.spec.code.as_str()), ("", ""));
        assert!(tr.spec.args.is_empty());
        // Control: a script tool on the same backend is a language run.
        let script = declare(json!({"language": "python", "script": SCRIPT}), &cx).unwrap();
        script.call(json!({"text": "a b"}), &ctx).await.unwrap();
        let runs = sandbox.runs.lock().unwrap();
        assert_eq!(runs[1].image, None);
        assert_eq!(runs[1].spec.language, Language::Python);
    }

    #[tokio::test]
    async fn an_image_tool_is_refused_outside_the_allow_list_and_off_kubernetes() {
        // Not on the list (the default list is empty): refused, the reason names the list.
        let (cx, _) = context("kubernetes", &[]);
        let e = declare(image_impl(IMAGE), &cx).err().unwrap();
        assert!(
            e.contains("not allowed") && e.contains("toolImages (none)"),
            "{e}"
        );
        let (cx, _) = context(
            "kubernetes",
            &["toolrun/sandbox:0.2.0", "registry.example.com/*"],
        );
        let e = declare(image_impl(IMAGE), &cx).err().unwrap();
        assert!(
            e.contains("toolrun/sandbox:0.2.0, registry.example.com/*"),
            "{e}"
        );
        // Control: listed exactly.
        let (cx, _) = context("kubernetes", &[IMAGE]);
        declare(image_impl(IMAGE), &cx).unwrap();
        // The local backend has no containers.
        let (cx, sandbox) = context("local", &[IMAGE]);
        let e = declare(image_impl(IMAGE), &cx).err().unwrap();
        assert!(e.contains("kubernetes backend only"), "{e}");
        // Control: a script tool on it is fine.
        declare(json!({"language": "python", "script": SCRIPT}), &cx).unwrap();
        assert!(sandbox.runs.lock().unwrap().is_empty());
    }

    #[test]
    fn an_image_declaration_is_checked_and_the_reason_names_the_key() {
        let (cx, _) = context("kubernetes", &["registry.example.com/*"]);
        let ok = |image: &str, command: Value| json!({"image": image, "command": command});
        // Control.
        declare(ok("registry.example.com/wc:1", json!(["/wc"])), &cx).unwrap();
        for (implementation, why) in [
            (
                json!({"image": "registry.example.com/wc:1"}),
                "implementation.command: missing",
            ),
            (json!({"command": ["/wc"]}), "implementation.image: missing"),
            (
                json!({"image": "registry.example.com/wc:1", "command": ["/wc"], "language": "python"}),
                "not both",
            ),
            (
                json!({"image": "registry.example.com/wc:1", "command": ["/wc"], "script": "x"}),
                "not both",
            ),
            (
                ok("registry.example.com/wc:1", json!([""])),
                "command[0]: the program is empty",
            ),
            (
                ok("registry.example.com/wc 1", json!(["/wc"])),
                "not an image reference",
            ),
            (ok("", json!(["/wc"])), "not an image reference"),
            (
                ok(
                    &format!("registry.example.com/{}", "w".repeat(500)),
                    json!(["/wc"]),
                ),
                "not an image reference",
            ),
            (
                ok("registry.example.com/wc:1", json!(vec!["a"; 65])),
                "65 elements, at most 64",
            ),
            (
                ok(
                    "registry.example.com/wc:1",
                    json!(["/wc", "x".repeat(4097)]),
                ),
                "command[1]: 4097 characters",
            ),
            (
                ok("registry.example.com.evil.example/wc:1", json!(["/wc"])),
                "not allowed",
            ),
        ] {
            let e = declare(implementation.clone(), &cx)
                .err()
                .unwrap_or_else(|| panic!("{implementation} built"));
            assert!(e.contains(why), "{implementation}: {e}");
        }
    }
}
