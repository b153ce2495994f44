//! Ollama `/api/chat`.
//!
//! Calls: `message.tool_calls[{function{name, arguments}}]` with `arguments` an object
//! (a string is taken as JSON text, as Ollama's OpenAI-compatible endpoint sends it);
//! recent Ollama versions add an `id`, used when present. Accepted input: the `/api/chat`
//! response (`{model, created_at, message: {..}, done}`) or the message itself.
//!
//! Results: one `{role: "tool", tool_name, content}` message per call, in request order
//! (Ollama matches results by tool name and order).
//!
//! Definitions: the OpenAI Chat shape `{type: "function", function{name, description,
//! parameters}}` (no `strict`).

use serde_json::{Value, json};

use serde::Serialize;

use super::{ProviderCall, function_tool_calls, kind, result_text, to_json};
use crate::exec::CallOutcome;
use crate::registry::Entry;

/// The `tools` entry for `entry`.
pub fn definition(entry: &Entry) -> Value {
    let m = entry.tool.metadata();
    json!({
        "type": "function",
        "function": {
            "name": m.id,
            "description": m.description,
            "parameters": entry.tool.input_schema(),
        }
    })
}

/// The calls in `v`.
pub fn parse(v: &Value) -> Result<Vec<ProviderCall>, String> {
    if !v.is_object() {
        return Err(format!("expected a JSON object, got {}", kind(v)));
    }
    let msg = match v.get("message") {
        Some(m) if m.is_object() => m,
        Some(m) => return Err(format!("$.message must be an object, got {}", kind(m))),
        None => v,
    };
    function_tool_calls(msg.get("tool_calls"))
}

#[derive(Serialize)]
struct ToolMessage<'a> {
    role: &'static str,
    tool_name: &'a str,
    content: String,
}

/// One `role: tool` message per call.
pub fn render(calls: &[ProviderCall], outcomes: &[CallOutcome]) -> String {
    let messages: Vec<ToolMessage> = calls
        .iter()
        .zip(outcomes)
        .map(|(c, o)| ToolMessage {
            role: "tool",
            tool_name: &c.name,
            content: result_text(o),
        })
        .collect();
    to_json(&messages)
}

/// An `/api/chat` response carrying `calls` (round trips, benches).
pub fn assistant_message(calls: &[ProviderCall]) -> Value {
    let tool_calls: Vec<Value> = calls
        .iter()
        .map(|c| {
            let mut call = json!({"function": {
                "name": c.name,
                "arguments": super::arguments_value(&c.arguments_json),
            }});
            if !c.id.is_empty() {
                call["id"] = json!(c.id);
            }
            call
        })
        .collect();
    json!({
        "model": "llama3.2",
        "created_at": "2026-11-23T22:00:00Z",
        "message": {"role": "assistant", "content": "", "tool_calls": tool_calls},
        "done": true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_response_and_the_message() {
        let resp = json!({"model": "llama3.2", "message": {"role": "assistant", "content": "",
            "tool_calls": [
                {"function": {"name": "calculator", "arguments": {"expression": "3*3"}}},
                {"function": {"name": "echo", "arguments": "{\"message\":\"x\"}"}}
            ]}, "done": true});
        let calls = parse(&resp).unwrap();
        assert_eq!(calls[0].arguments_json, r#"{"expression":"3*3"}"#);
        assert_eq!(calls[1].arguments_json, r#"{"message":"x"}"#);
        assert_eq!(parse(&resp["message"]).unwrap(), calls);
        assert!(parse(&json!({"message": 3})).is_err());
    }
}
