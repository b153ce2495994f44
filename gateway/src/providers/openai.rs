//! OpenAI Chat Completions.
//!
//! Calls: the assistant message's `tool_calls[{id, type: "function", function{name,
//! arguments}}]`, where `arguments` is JSON *text* written by the model; it reaches the
//! executor untouched, so text that is not JSON (or not an object) is an
//! INVALID_ARGUMENTS result for that call alone. Accepted input: the assistant message
//! (`{role: "assistant", content, tool_calls}`) or the whole API response (`{object:
//! "chat.completion", choices: [{message}]}`, first choice).
//!
//! Results: one `{role: "tool", tool_call_id, content}` message per call, in request
//! order; `content` is the output JSON, or `{"error": {code, message, ..}}` on failure.
//!
//! Definitions: `{type: "function", function{name, description, parameters, strict}}`,
//! `strict: true` only where the schema qualifies ([`super::strict_qualifies`]).

use serde_json::{Value, json};

use serde::Serialize;

use super::{ProviderCall, array_field, function_tool_calls, kind, result_text, to_json};
use crate::exec::CallOutcome;
use crate::registry::Entry;

/// The `tools` entry for `entry`.
pub fn definition(entry: &Entry) -> Value {
    let m = entry.tool.metadata();
    let input = entry.tool.input_schema();
    json!({
        "type": "function",
        "function": {
            "name": m.id,
            "description": m.description,
            "parameters": input,
            "strict": super::strict_qualifies(input),
        }
    })
}

/// The assistant message inside `v` (the message itself, or `choices[0].message`).
pub(crate) fn message(v: &Value) -> Result<&Value, String> {
    if !v.is_object() {
        return Err(format!("expected a JSON object, got {}", kind(v)));
    }
    if v.get("choices").is_some() {
        let choices = array_field(v, "choices", "$")?;
        let first = choices.first().ok_or("$.choices is empty")?;
        return first
            .get("message")
            .filter(|m| m.is_object())
            .ok_or_else(|| "$.choices[0].message is missing".to_string());
    }
    Ok(v)
}

/// The calls in `v`.
pub fn parse(v: &Value) -> Result<Vec<ProviderCall>, String> {
    function_tool_calls(message(v)?.get("tool_calls"))
}

#[derive(Serialize)]
struct ToolMessage<'a> {
    role: &'static str,
    tool_call_id: &'a str,
    content: String,
}

/// One `role: tool` message per call.
pub fn render(calls: &[ProviderCall], outcomes: &[CallOutcome]) -> String {
    let messages: Vec<ToolMessage> = calls
        .iter()
        .zip(outcomes)
        .map(|(c, o)| ToolMessage {
            role: "tool",
            tool_call_id: &c.id,
            content: result_text(o),
        })
        .collect();
    to_json(&messages)
}

/// An assistant message carrying `calls` as OpenAI writes it (round trips, benches).
pub fn assistant_message(calls: &[ProviderCall]) -> Value {
    let tool_calls: Vec<Value> = calls
        .iter()
        .map(|c| {
            json!({
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments_json},
            })
        })
        .collect();
    json!({"role": "assistant", "content": null, "tool_calls": tool_calls})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_message_and_the_full_response() {
        let msg = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "calculator", "arguments": "{\"expression\":\"1+1\"}"}},
            {"id": "call_2", "type": "function",
             "function": {"name": "echo", "arguments": "{not json"}}
        ]});
        let calls = parse(&msg).unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].id, "call_1");
        assert_eq!(calls[0].arguments_json, "{\"expression\":\"1+1\"}");
        // Passed through as given: the executor reports it for this call only.
        assert_eq!(calls[1].arguments_json, "{not json");
        let full = json!({"object": "chat.completion", "choices": [
            {"index": 0, "message": msg, "finish_reason": "tool_calls"}]});
        assert_eq!(parse(&full).unwrap(), calls);
    }

    #[test]
    fn unreadable_messages_say_where() {
        assert!(parse(&json!([1])).unwrap_err().contains("object"));
        assert!(
            parse(&json!({"choices": []}))
                .unwrap_err()
                .contains("empty")
        );
        assert!(
            parse(&json!({"tool_calls": {"id": "x"}}))
                .unwrap_err()
                .contains("array")
        );
        assert!(
            parse(&json!({"tool_calls": ["x"]}))
                .unwrap_err()
                .contains("tool_calls[0]")
        );
        assert!(
            parse(&json!({"role": "assistant", "content": "hi"}))
                .unwrap()
                .is_empty()
        );
    }
}
