//! Google Gemini `generateContent`.
//!
//! Calls: the model content's parts `{functionCall{id?, name, args}}` (`args` an object;
//! the Python SDK's snake_case `function_call` is read too); text and thought parts are
//! skipped. The `id` is optional (the Gemini Developer API sets it, Vertex AI does not):
//! results carry it back when it was given. Accepted input: the API response
//! (`{candidates: [{content: {role: "model", parts}}]}`, first candidate), the content
//! (`{role: "model", parts}`), or the bare `parts` array.
//!
//! Results: ONE content `{role: "user", parts: [{functionResponse{id?, name, response}}]}`
//! with a part per call in request order; `response` is `{"output": <output>}`, or
//! `{"error": {code, message, ..}, "output"?}` on failure (the keys Gemini documents).
//!
//! Definitions: a `functionDeclarations` entry `{name, description, parametersJsonSchema}`
//! (full JSON Schema; the older `parameters` field takes only an OpenAPI subset).

use serde_json::{Map, Value, json};

use serde::Serialize;
use serde_json::value::RawValue;

use super::{
    ErrorResult, ProviderCall, array_field, error_result, kind, object_arguments_text, raw_output,
    str_field, to_json,
};
use crate::exec::CallOutcome;
use crate::registry::Entry;

/// The `functionDeclarations` entry for `entry`.
pub fn definition(entry: &Entry) -> Value {
    let m = entry.tool.metadata();
    json!({
        "name": m.id,
        "description": m.description,
        "parametersJsonSchema": entry.tool.input_schema(),
    })
}

/// The calls in `v`.
pub fn parse(v: &Value) -> Result<Vec<ProviderCall>, String> {
    let parts: &[Value] = match v {
        Value::Array(a) => a,
        Value::Object(o) if o.contains_key("candidates") => {
            let candidates = array_field(v, "candidates", "$")?;
            let first = candidates.first().ok_or("$.candidates is empty")?;
            let content = first
                .get("content")
                .ok_or("$.candidates[0].content is missing (finishReason?)")?;
            array_field(content, "parts", "$.candidates[0].content")?
        }
        Value::Object(_) => array_field(v, "parts", "$")?,
        other => {
            return Err(format!(
                "expected a JSON object or array, got {}",
                kind(other)
            ));
        }
    };
    let mut calls = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        if !part.is_object() {
            return Err(format!("parts[{i}] must be an object, got {}", kind(part)));
        }
        let Some(call) = part
            .get("functionCall")
            .or_else(|| part.get("function_call"))
        else {
            continue;
        };
        if !call.is_object() {
            return Err(format!(
                "parts[{i}].functionCall must be an object, got {}",
                kind(call)
            ));
        }
        calls.push(ProviderCall {
            id: str_field(call, "id"),
            name: str_field(call, "name"),
            arguments_json: object_arguments_text(call.get("args")),
        });
    }
    Ok(calls)
}

#[derive(Serialize)]
struct UserContent<'a> {
    role: &'static str,
    parts: Vec<Part<'a>>,
}

#[derive(Serialize)]
struct Part<'a> {
    #[serde(rename = "functionResponse")]
    function_response: FunctionResponse<'a>,
}

#[derive(Serialize)]
struct FunctionResponse<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    id: &'a str,
    name: &'a str,
    response: Response<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Response<'a> {
    Output { output: Option<&'a RawValue> },
    Error(ErrorResult<'a>),
}

/// One user content with a `functionResponse` part per call.
pub fn render(calls: &[ProviderCall], outcomes: &[CallOutcome]) -> String {
    let parts = calls
        .iter()
        .zip(outcomes)
        .map(|(c, o)| Part {
            function_response: FunctionResponse {
                id: &c.id,
                name: &c.name,
                response: match error_result(o) {
                    Some(e) => Response::Error(e),
                    None => Response::Output {
                        output: raw_output(o),
                    },
                },
            },
        })
        .collect();
    to_json(&UserContent {
        role: "user",
        parts,
    })
}

/// A `generateContent` response carrying `calls` (round trips, benches).
pub fn assistant_message(calls: &[ProviderCall]) -> Value {
    let parts: Vec<Value> = calls
        .iter()
        .map(|c| {
            let mut call = Map::new();
            if !c.id.is_empty() {
                call.insert("id".into(), Value::String(c.id.clone()));
            }
            call.insert("name".into(), Value::String(c.name.clone()));
            call.insert("args".into(), super::arguments_value(&c.arguments_json));
            json!({"functionCall": call})
        })
        .collect();
    json!({"candidates": [{"content": {"role": "model", "parts": parts},
                           "finishReason": "STOP", "index": 0}]})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_candidates_content_and_parts_ids_optional() {
        let resp = json!({"candidates": [{"content": {"role": "model", "parts": [
            {"text": "Calling tools."},
            {"functionCall": {"name": "calculator", "args": {"expression": "1+2"}}},
            {"functionCall": {"id": "fc-2", "name": "echo", "args": {"message": "m"}}}
        ]}, "finishReason": "STOP"}]});
        let calls = parse(&resp).unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].id, "");
        assert_eq!(calls[1].id, "fc-2");
        assert_eq!(parse(&resp["candidates"][0]["content"]).unwrap(), calls);
        assert_eq!(
            parse(&resp["candidates"][0]["content"]["parts"]).unwrap(),
            calls
        );
        let snake = json!({"parts": [{"function_call": {"name": "echo", "args": {}}}]});
        assert_eq!(parse(&snake).unwrap()[0].name, "echo");
        assert!(
            parse(&json!({"candidates": []}))
                .unwrap_err()
                .contains("empty")
        );
    }
}
