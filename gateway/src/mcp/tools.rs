//! Registry entries as MCP tools, and call outcomes as MCP `tools/call` results.
//!
//! - Input schemas are the tools' own JSON Schemas; annotations come from the metadata:
//!   `readOnlyHint` = pure; `destructiveHint` = impure and asks for approval (the tools that
//!   overwrite, delete or run commands); `idempotentHint` = deterministic; `openWorldHint` =
//!   non-deterministic and not sandboxed execution (sandboxes have no network).
//! - Output schemas are declared for tools whose output is an object, as
//!   `anyOf: [the tool's output schema, the error envelope]`: every success passes the
//!   executor's output validation, and every failure is the envelope
//!   `{error: {code, message, details?}, output?}`, so neither breaks a client that
//!   validates `structuredContent` (the Python `mcp` client raises on a mismatch).

use std::sync::Arc;

use rmcp::model::{CallToolResult, ContentBlock, JsonObject, MetaObject, Tool, ToolAnnotations};
use serde_json::{Value, json};

use crate::error::{ErrorCode, ToolError};
use crate::exec::CallOutcome;
use crate::registry::Entry;
use crate::tool::{ApprovalPolicy, Category, Determinism, Hints, SideEffect, ToolMetadata};

/// `_meta` keys toolrun reads on requests and writes on results.
pub mod meta_keys {
    /// The session a `tools/call` joins (also the `toolrun-session-id` header or the
    /// `session_id` URL query parameter).
    pub const SESSION_ID: &str = "toolrun.dev/session_id";
    /// The caller's bound on the call, in ms (the tool's own timeout still applies).
    pub const TIMEOUT_MS: &str = "toolrun.dev/timeout_ms";
    /// The call id (the caller's, or the one the gateway made).
    pub const CALL_ID: &str = "toolrun.dev/call_id";
    /// Lowercase hex BLAKE3 of the canonical output.
    pub const OUTPUT_HASH: &str = "toolrun.dev/output_hash";
    /// Time spent in the gateway, microseconds.
    pub const DURATION_US: &str = "toolrun.dev/duration_us";
    /// On progress notifications: `stdout`, `stderr` or `approval`.
    pub const STREAM: &str = "toolrun.dev/stream";
    /// On progress notifications: the approval the call waits for.
    pub const APPROVAL: &str = "toolrun.dev/approval";
}

/// The MCP definition of a registered tool.
pub fn tool(entry: &Entry) -> Tool {
    let m = entry.tool.metadata();
    let annotations = match entry.tool.hints() {
        Some(h) => declared_annotations(m, h),
        None => annotations(m),
    };
    let mut t = Tool::new(
        m.id.clone(),
        m.description.clone(),
        Arc::new(object(entry.tool.input_schema())),
    )
    .with_title(m.name.clone())
    .with_annotations(annotations);
    if let Some(schema) = output_schema(entry.tool.output_schema()) {
        t = t.with_raw_output_schema(Arc::new(schema));
    }
    t
}

/// The annotations the metadata implies (hints for clients; the gateway enforces policy
/// itself).
pub fn annotations(m: &ToolMetadata) -> ToolAnnotations {
    let read_only = m.side_effect == SideEffect::Pure;
    ToolAnnotations::with_title(m.name.clone())
        .read_only(read_only)
        .destructive(!read_only && m.approval != ApprovalPolicy::Never)
        .idempotent(m.determinism == Determinism::Deterministic)
        .open_world(
            m.determinism == Determinism::NonDeterministic && m.category != Category::Execution,
        )
}

/// The annotations a custom tool declares, as declared.
pub fn declared_annotations(m: &ToolMetadata, h: Hints) -> ToolAnnotations {
    ToolAnnotations::with_title(m.name.clone())
        .read_only(h.read_only)
        .destructive(h.destructive)
        .idempotent(h.idempotent)
        .open_world(h.open_world)
}

fn object(schema: &Value) -> JsonObject {
    match schema {
        Value::Object(map) => map.clone(),
        // Registered tools' schemas are objects; anything else is served as "any object".
        _ => json!({"type": "object"})
            .as_object()
            .cloned()
            .unwrap_or_default(),
    }
}

/// The schema of a failed call's `structuredContent`.
pub fn error_envelope_schema() -> Value {
    json!({
        "title": "ToolrunError",
        "description": "The call failed: error.code is toolrun's typed code (INVALID_ARGUMENTS, \
                        TIMEOUT, EXECUTION_ERROR, ...); output is what the tool produced before \
                        failing, when it produced anything.",
        "type": "object",
        "required": ["error"],
        "additionalProperties": false,
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {"type": "string"},
                    "message": {"type": "string"},
                    "details": {}
                }
            },
            "output": {}
        }
    })
}

/// The declared output schema: the tool's own (an object) or the error envelope; `None`
/// when the tool's output is not an object (MCP output schemas describe objects).
fn output_schema(schema: &Value) -> Option<JsonObject> {
    let Value::Object(own) = schema else {
        return None;
    };
    if own.get("type").and_then(Value::as_str) != Some("object") {
        return None;
    }
    let mut own = own.clone();
    let mut wrapper = JsonObject::new();
    // Keep the dialect and the definitions at the root, where `#/$defs/...` resolves.
    if let Some(dialect) = own.remove("$schema") {
        wrapper.insert("$schema".into(), dialect);
    }
    let defs = own.remove("$defs");
    wrapper.insert("type".into(), json!("object"));
    wrapper.insert(
        "anyOf".into(),
        json!([Value::Object(own), error_envelope_schema()]),
    );
    if let Some(defs) = defs {
        wrapper.insert("$defs".into(), defs);
    }
    Some(wrapper)
}

/// A tool failure as an `isError` result: the envelope in `structuredContent`, and
/// `CODE: message` (with the output, when any) as text.
pub fn error_result(error: &ToolError, output: Option<Value>) -> CallToolResult {
    let mut err = json!({"code": error.code.as_str(), "message": error.message});
    if let Some(details) = &error.details {
        err["details"] = details.clone();
    }
    let mut text = format!("{}: {}", error.code, error.message);
    let mut envelope = json!({ "error": err });
    if let Some(output) = output {
        text.push('\n');
        text.push_str(&output.to_string());
        envelope["output"] = output;
    }
    let mut r = CallToolResult::error(vec![ContentBlock::text(text)]);
    r.structured_content = Some(envelope);
    r
}

/// The result of a finished call: `structuredContent` plus the canonical JSON as text on
/// success, the error envelope with `isError: true` on failure; call id, output hash and
/// duration in `_meta`.
pub fn call_result(outcome: CallOutcome) -> CallToolResult {
    let mut meta = JsonObject::new();
    meta.insert(meta_keys::CALL_ID.into(), json!(outcome.call_id));
    meta.insert(
        meta_keys::DURATION_US.into(),
        json!(outcome.duration.as_micros() as u64),
    );
    if !outcome.output_hash.is_empty() {
        meta.insert(meta_keys::OUTPUT_HASH.into(), json!(outcome.output_hash));
    }
    let output = outcome
        .output_json
        .as_deref()
        .map(|text| serde_json::from_str::<Value>(text).map(|v| (text, v)));
    let result = match (outcome.error, output) {
        (Some(error), output) => error_result(&error, output.and_then(Result::ok).map(|(_, v)| v)),
        (None, Some(Ok((text, value)))) => {
            let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
            // Structured content describes objects; every built-in's output is one.
            if value.is_object() {
                r.structured_content = Some(value);
            }
            r
        }
        (None, None) => CallToolResult::success(vec![ContentBlock::text("null")]),
        (None, Some(Err(e))) => error_result(
            &ToolError::new(
                ErrorCode::Internal,
                format!("the tool's canonical output is not JSON: {e}"),
            ),
            None,
        ),
    };
    result.with_meta(Some(MetaObject(meta)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::ToolMetadata;

    fn meta(
        side_effect: SideEffect,
        approval: ApprovalPolicy,
        d: Determinism,
        c: Category,
    ) -> ToolMetadata {
        ToolMetadata {
            side_effect,
            approval,
            determinism: d,
            category: c,
            ..ToolMetadata::pure_inline("t", "T", "test", Category::Utility)
        }
    }

    #[test]
    fn annotations_follow_the_metadata() {
        use ApprovalPolicy::*;
        use Category::*;
        use Determinism::*;
        use SideEffect::*;
        let a = annotations(&meta(Pure, Never, Deterministic, Computation));
        assert_eq!(
            (
                a.read_only_hint,
                a.destructive_hint,
                a.idempotent_hint,
                a.open_world_hint
            ),
            (Some(true), Some(false), Some(true), Some(false))
        );
        // write_file: impure, asks before overwriting.
        let a = annotations(&meta(Impure, Conditional, Deterministic, Filesystem));
        assert_eq!(
            (a.read_only_hint, a.destructive_hint, a.idempotent_hint),
            (Some(false), Some(true), Some(true))
        );
        // run_code: sandboxed execution has no network: closed world.
        let a = annotations(&meta(Impure, Conditional, NonDeterministic, Execution));
        assert_eq!(
            (a.idempotent_hint, a.open_world_hint),
            (Some(false), Some(false))
        );
        // A web tool: the open world.
        let a = annotations(&meta(Pure, Never, NonDeterministic, Search));
        assert_eq!(a.open_world_hint, Some(true));
    }

    #[test]
    fn output_schemas_admit_successes_and_the_error_envelope() {
        let own = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "required": ["value"],
            "properties": {"value": {"$ref": "#/$defs/V"}},
            "$defs": {"V": {"type": "number"}}
        });
        let wrapped = Value::Object(output_schema(&own).unwrap());
        let v = jsonschema::validator_for(&wrapped).unwrap();
        assert!(v.is_valid(&json!({"value": 1})));
        assert!(
            !v.is_valid(&json!({"value": "x"})),
            "the $ref still resolves"
        );
        let failure = error_result(&ToolError::invalid_arguments("bad"), None);
        assert!(v.is_valid(failure.structured_content.as_ref().unwrap()));
        let with_output = error_result(
            &ToolError::new(ErrorCode::ExecutionError, "exit 1"),
            Some(json!({"stdout": ""})),
        );
        assert!(v.is_valid(with_output.structured_content.as_ref().unwrap()));
        assert!(output_schema(&json!({"type": "string"})).is_none());
    }
}
