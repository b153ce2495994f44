//! toolrun's own formats: the native definition (all metadata), and the seeds' invocation
//! format (seed 000) as provider `toolrun`.
//!
//! Calls: `{"tool_call": {tool_id, input, call_id?}}` or `{"tool_calls": [{..}, ..]}`.
//! Results: `{"tool_result": {..}}` for a single `tool_call`, else `{"tool_results": [..]}`
//! in request order, each `{call_id?, tool_id, success, output, error?}` (`error` is
//! `{code, message, details?}`; `output` is null when the tool produced none).

use serde_json::{Value, json};

use serde::Serialize;
use serde_json::value::RawValue;

use super::{
    ErrorBody, ProviderCall, error_result, kind, object_arguments_text, raw_output, str_field,
    to_json,
};
use crate::exec::CallOutcome;
use crate::registry::Entry;

/// toolrun's native definition.
pub fn definition(entry: &Entry) -> Value {
    let m = entry.tool.metadata();
    json!({
        "id": m.id,
        "name": m.name,
        "description": m.description,
        "version": m.version,
        "category": m.category,
        "input_schema": entry.tool.input_schema(),
        "output_schema": entry.tool.output_schema(),
        "sandbox_required": m.sandbox_required,
        "side_effect": m.side_effect,
        "determinism": m.determinism,
        "approval_policy": m.approval,
        "timeout_ms": entry.timeout.as_millis() as u64,
        "required_capabilities": m.required_capabilities,
        "aliases": entry.aliases,
    })
}

/// The calls in `v`, and whether it was a single `tool_call`.
pub fn parse(v: &Value) -> Result<(Vec<ProviderCall>, bool), String> {
    if !v.is_object() {
        return Err(format!("expected a JSON object, got {}", kind(v)));
    }
    let (entries, single): (&[Value], bool) = match (v.get("tool_call"), v.get("tool_calls")) {
        (Some(one), None) => (std::slice::from_ref(one), true),
        (None, Some(Value::Array(many))) => (many, false),
        (None, Some(other)) => {
            return Err(format!("tool_calls must be an array, got {}", kind(other)));
        }
        (Some(_), Some(_)) => return Err("give tool_call or tool_calls, not both".into()),
        (None, None) => return Err("expected `tool_call` or `tool_calls`".into()),
    };
    let calls = entries
        .iter()
        .enumerate()
        .map(|(i, c)| {
            if !c.is_object() {
                return Err(format!(
                    "tool_calls[{i}] must be an object, got {}",
                    kind(c)
                ));
            }
            Ok(ProviderCall {
                id: str_field(c, "call_id"),
                name: str_field(c, "tool_id"),
                arguments_json: object_arguments_text(c.get("input")),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok((calls, single))
}

#[derive(Serialize)]
struct ToolResult<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    call_id: &'a str,
    tool_id: &'a str,
    success: bool,
    output: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<ErrorBody<'a>>,
}

#[derive(Serialize)]
enum Results<'a> {
    #[serde(rename = "tool_result")]
    One(ToolResult<'a>),
    #[serde(rename = "tool_results")]
    Many(Vec<ToolResult<'a>>),
}

/// `{tool_result}` or `{tool_results}` for `calls`.
pub fn render(message: &Value, calls: &[ProviderCall], outcomes: &[CallOutcome]) -> String {
    let mut results = calls.iter().zip(outcomes).map(|(c, o)| ToolResult {
        call_id: &c.id,
        tool_id: &c.name,
        success: o.ok(),
        output: raw_output(o),
        error: error_result(o).map(|e| e.error),
    });
    let results = match results.next() {
        Some(first) if message.get("tool_call").is_some() && calls.len() == 1 => {
            Results::One(first)
        }
        first => Results::Many(first.into_iter().chain(results).collect()),
    };
    to_json(&results)
}

/// A `tool_calls` message carrying `calls` (round trips, benches).
pub fn assistant_message(calls: &[ProviderCall]) -> Value {
    let entries: Vec<Value> = calls
        .iter()
        .map(|c| {
            let mut e =
                json!({"tool_id": c.name, "input": super::arguments_value(&c.arguments_json)});
            if !c.id.is_empty() {
                e["call_id"] = json!(c.id);
            }
            e
        })
        .collect();
    json!({"tool_calls": entries})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_seed_formats() {
        let one = json!({"tool_call": {"tool_id": "calculator", "input": {"expression": "2 + 2"}}});
        let (calls, single) = parse(&one).unwrap();
        assert!(single);
        assert_eq!(calls[0].name, "calculator");
        let many = json!({"tool_calls": [
            {"tool_id": "calculator", "input": {"expression": "sqrt(16)"}},
            {"tool_id": "calculator", "input": {"expression": "2**10"}}
        ]});
        let (calls, single) = parse(&many).unwrap();
        assert!(!single);
        assert_eq!(calls.len(), 2);
        assert!(parse(&json!({"foo": 1})).is_err());
        assert!(parse(&json!({"tool_calls": 1})).is_err());
    }
}
