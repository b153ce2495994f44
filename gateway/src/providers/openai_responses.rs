//! OpenAI Responses API.
//!
//! Calls: output items `{type: "function_call", id, call_id, name, arguments}` (arguments
//! JSON text, passed to the executor untouched); other items (reasoning, messages) are
//! skipped. Accepted input: the whole response (`{object: "response", output: [..]}`), the
//! `output` array, or one `function_call` item.
//!
//! Results: one `{type: "function_call_output", call_id, output}` input item per call, in
//! request order; `output` is the output JSON, or `{"error": {..}}` on failure.
//!
//! Definitions: `{type: "function", name, description, parameters, strict}` (flat, unlike
//! Chat Completions), `strict: true` only where the schema qualifies.

use serde_json::{Value, json};

use serde::Serialize;

use super::{ProviderCall, arguments_text, array_field, kind, result_text, str_field, to_json};
use crate::exec::CallOutcome;
use crate::registry::Entry;

/// The `tools` entry for `entry`.
pub fn definition(entry: &Entry) -> Value {
    let m = entry.tool.metadata();
    let input = entry.tool.input_schema();
    json!({
        "type": "function",
        "name": m.id,
        "description": m.description,
        "parameters": input,
        "strict": super::strict_qualifies(input),
    })
}

/// The calls in `v`.
pub fn parse(v: &Value) -> Result<Vec<ProviderCall>, String> {
    let items: &[Value] = match v {
        Value::Array(a) => a,
        Value::Object(o) if o.contains_key("output") => array_field(v, "output", "$")?,
        Value::Object(_) if v.get("type").is_some() => std::slice::from_ref(v),
        Value::Object(_) => {
            return Err(
                "expected a response with `output`, an array of items, or a \
                        function_call item"
                    .into(),
            );
        }
        other => {
            return Err(format!(
                "expected a JSON object or array, got {}",
                kind(other)
            ));
        }
    };
    let mut calls = Vec::new();
    for (i, item) in items.iter().enumerate() {
        if !item.is_object() {
            return Err(format!("output[{i}] must be an object, got {}", kind(item)));
        }
        if item.get("type").and_then(Value::as_str) != Some("function_call") {
            continue;
        }
        calls.push(ProviderCall {
            id: str_field(item, "call_id"),
            name: str_field(item, "name"),
            arguments_json: arguments_text(item.get("arguments")),
        });
    }
    Ok(calls)
}

#[derive(Serialize)]
struct OutputItem<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    call_id: &'a str,
    output: String,
}

/// One `function_call_output` item per call.
pub fn render(calls: &[ProviderCall], outcomes: &[CallOutcome]) -> String {
    let items: Vec<OutputItem> = calls
        .iter()
        .zip(outcomes)
        .map(|(c, o)| OutputItem {
            kind: "function_call_output",
            call_id: &c.id,
            output: result_text(o),
        })
        .collect();
    to_json(&items)
}

/// A response carrying `calls` as `function_call` items (round trips, benches).
pub fn assistant_message(calls: &[ProviderCall]) -> Value {
    let output: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({
                "type": "function_call",
                "id": format!("fc_{i}"),
                "call_id": c.id,
                "name": c.name,
                "arguments": c.arguments_json,
                "status": "completed",
            })
        })
        .collect();
    json!({"object": "response", "status": "completed", "output": output})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_response_items_and_single_item_and_skips_others() {
        let response = json!({"object": "response", "status": "completed", "output": [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "echo",
             "arguments": "{\"message\":\"hi\"}", "status": "completed"},
            {"type": "function_call", "id": "fc_2", "call_id": "call_b", "name": "hash",
             "arguments": "{\"data\":\"x\"}", "status": "completed"}
        ]});
        let calls = parse(&response).unwrap();
        assert_eq!(
            calls.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
            ["call_a", "call_b"]
        );
        assert_eq!(parse(&response["output"]).unwrap(), calls);
        assert_eq!(parse(&response["output"][1]).unwrap(), calls[..1]);
        assert!(parse(&json!({"foo": 1})).is_err());
        assert!(
            parse(&json!({"output": "x"}))
                .unwrap_err()
                .contains("array")
        );
    }
}
