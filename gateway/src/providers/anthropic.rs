//! Anthropic Messages API.
//!
//! Calls: the assistant message's `content` blocks `{type: "tool_use", id, name, input}`
//! (`input` an object); text and thinking blocks are skipped. Accepted input: the API
//! response (`{type: "message", role: "assistant", content: [..]}`), the conversation
//! message `{role: "assistant", content: [..]}`, or the bare `content` array.
//!
//! Results: ONE user message `{role: "user", content: [{type: "tool_result", tool_use_id,
//! content, is_error}, ..]}` with a block per call in request order (Anthropic wants every
//! result of a turn in the next user message); `content` is the output JSON, or
//! `{"error": {..}}` with `is_error: true`.
//!
//! Definitions: `{name, description, input_schema}`.

use serde_json::{Value, json};

use serde::Serialize;

use super::{
    ProviderCall, array_field, kind, object_arguments_text, result_text, str_field, to_json,
};
use crate::exec::CallOutcome;
use crate::registry::Entry;

/// The `tools` entry for `entry`.
pub fn definition(entry: &Entry) -> Value {
    let m = entry.tool.metadata();
    json!({
        "name": m.id,
        "description": m.description,
        "input_schema": entry.tool.input_schema(),
    })
}

/// The calls in `v`.
pub fn parse(v: &Value) -> Result<Vec<ProviderCall>, String> {
    let blocks: &[Value] = match v {
        Value::Array(a) => a,
        Value::Object(_) => array_field(v, "content", "$")?,
        other => {
            return Err(format!(
                "expected a JSON object or array, got {}",
                kind(other)
            ));
        }
    };
    let mut calls = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        if !block.is_object() {
            return Err(format!(
                "content[{i}] must be an object, got {}",
                kind(block)
            ));
        }
        if block.get("type").and_then(Value::as_str) != Some("tool_use") {
            continue;
        }
        calls.push(ProviderCall {
            id: str_field(block, "id"),
            name: str_field(block, "name"),
            arguments_json: object_arguments_text(block.get("input")),
        });
    }
    Ok(calls)
}

#[derive(Serialize)]
struct UserMessage<'a> {
    role: &'static str,
    content: Vec<ToolResultBlock<'a>>,
}

#[derive(Serialize)]
struct ToolResultBlock<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    tool_use_id: &'a str,
    content: String,
    is_error: bool,
}

/// One user message with a `tool_result` block per call.
pub fn render(calls: &[ProviderCall], outcomes: &[CallOutcome]) -> String {
    let content = calls
        .iter()
        .zip(outcomes)
        .map(|(c, o)| ToolResultBlock {
            kind: "tool_result",
            tool_use_id: &c.id,
            content: result_text(o),
            is_error: !o.ok(),
        })
        .collect();
    to_json(&UserMessage {
        role: "user",
        content,
    })
}

/// An API response carrying `calls` as `tool_use` blocks (round trips, benches).
pub fn assistant_message(calls: &[ProviderCall]) -> Value {
    let content: Vec<Value> = calls
        .iter()
        .map(|c| {
            json!({
                "type": "tool_use",
                "id": c.id,
                "name": c.name,
                "input": super::arguments_value(&c.arguments_json),
            })
        })
        .collect();
    json!({"type": "message", "role": "assistant", "content": content,
           "stop_reason": "tool_use"})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tool_use_blocks_and_skips_text() {
        let msg = json!({"id": "msg_1", "type": "message", "role": "assistant", "content": [
            {"type": "text", "text": "Let me compute."},
            {"type": "tool_use", "id": "toolu_1", "name": "calculator",
             "input": {"expression": "2+2"}},
            {"type": "tool_use", "id": "toolu_2", "name": "echo", "input": "not an object"}
        ], "stop_reason": "tool_use"});
        let calls = parse(&msg).unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments_json, r#"{"expression":"2+2"}"#);
        // A string input reaches the executor as a JSON string: INVALID_ARGUMENTS there.
        assert_eq!(calls[1].arguments_json, r#""not an object""#);
        assert_eq!(parse(&msg["content"]).unwrap(), calls);
        assert!(
            parse(&json!({"role": "assistant"}))
                .unwrap_err()
                .contains("content")
        );
    }
}
