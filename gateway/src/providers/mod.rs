//! Model providers' tool-call formats: one module per provider, each with the three things
//! an agent loop needs — the tool definitions in that provider's shape, the calls read out
//! of an assistant message as the provider returns it, and the results rendered as the
//! provider's tool-result message(s), ready to append to the conversation in request order.
//!
//! | provider | calls read from | results rendered as |
//! |---|---|---|
//! | `openai` ([`openai`]) | `tool_calls[{id, function{name, arguments: JSON text}}]` | `[{role: tool, tool_call_id, content}]` |
//! | `openai-responses` ([`openai_responses`]) | items `{type: function_call, call_id, name, arguments}` | `[{type: function_call_output, call_id, output}]` |
//! | `anthropic` ([`anthropic`]) | blocks `{type: tool_use, id, name, input}` | `{role: user, content: [{type: tool_result, tool_use_id, content, is_error}]}` |
//! | `ollama` ([`ollama`]) | `message.tool_calls[{function{name, arguments: object}}]` | `[{role: tool, tool_name, content}]` |
//! | `gemini` ([`gemini`]) | parts `{functionCall{id?, name, args}}` | `{role: user, parts: [{functionResponse{id?, name, response}}]}` |
//! | `toolrun` ([`toolrun`]) | seed 000's `{tool_call: {tool_id, input}}` / `{tool_calls: [..]}` | `{tool_result: ..}` / `{tool_results: [..]}` |
//!
//! Every call runs through the one executor ([`Executor::start`], concurrently, results in
//! request order), with the message's session applied to each. A call the executor turns
//! down (unknown tool, arguments that are not JSON or break the schema) is a result for
//! that call, never a failure of the whole message; only a message that cannot be read
//! at all is an error ([`ProviderError`]). The front doors — gRPC `CallProviderTools`,
//! HTTP `POST /v1/{provider}/tool-calls` ([`http`]) and `toolrun call --from` — are thin
//! adapters over [`run`].
//!
//! [`mcp`] renders MCP `tools/list` entries; [`render`] is the one entry point for
//! definitions in every [`Format`]. Definition checks live in [`crate::validation`].

pub mod anthropic;
pub mod gemini;
pub mod http;
pub mod mcp;
pub mod ollama;
pub mod openai;
pub mod openai_responses;
pub mod toolrun;

use std::sync::Arc;

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::auth::Tenant;
use crate::exec::{CallOutcome, CallRequest, Executor};
use crate::registry::Entry;

/// Most calls read from one message (the same bound as a gRPC `CallTools` batch).
pub const MAX_CALLS: usize = crate::grpc::MAX_BATCH;

/// A provider's tool-call format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Provider {
    /// OpenAI Chat Completions.
    Openai,
    /// OpenAI Responses API.
    OpenaiResponses,
    /// Anthropic Messages API.
    Anthropic,
    /// Ollama `/api/chat`.
    Ollama,
    /// Google Gemini `generateContent`.
    Gemini,
    /// The seeds' own invocation format (seed 000).
    Toolrun,
}

impl Provider {
    /// Every provider, in the order they are listed to people.
    pub const ALL: [Provider; 6] = [
        Provider::Openai,
        Provider::OpenaiResponses,
        Provider::Anthropic,
        Provider::Ollama,
        Provider::Gemini,
        Provider::Toolrun,
    ];

    /// The wire name (`openai-responses`).
    pub fn name(self) -> &'static str {
        match self {
            Provider::Openai => "openai",
            Provider::OpenaiResponses => "openai-responses",
            Provider::Anthropic => "anthropic",
            Provider::Ollama => "ollama",
            Provider::Gemini => "gemini",
            Provider::Toolrun => "toolrun",
        }
    }

    /// The provider called `name`.
    pub fn from_name(name: &str) -> Result<Provider, ProviderError> {
        Provider::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| ProviderError::UnknownProvider(name.to_string()))
    }

    /// The tool calls in `message`, in order.
    pub fn parse(self, message: &Value) -> Result<Vec<ProviderCall>, ProviderError> {
        let calls = match self {
            Provider::Openai => openai::parse(message),
            Provider::OpenaiResponses => openai_responses::parse(message),
            Provider::Anthropic => anthropic::parse(message),
            Provider::Ollama => ollama::parse(message),
            Provider::Gemini => gemini::parse(message),
            Provider::Toolrun => toolrun::parse(message).map(|(calls, _)| calls),
        }
        .map_err(|message| ProviderError::BadMessage {
            provider: self,
            message,
        })?;
        if calls.is_empty() {
            return Err(ProviderError::NoCalls(self));
        }
        if calls.len() > MAX_CALLS {
            return Err(ProviderError::TooManyCalls(calls.len()));
        }
        Ok(calls)
    }

    /// The provider-shaped result message(s) for `calls` and their outcomes (same order),
    /// as JSON text; `message` is the message the calls were read from (the `toolrun`
    /// format answers a single `tool_call` with a single `tool_result`). Written straight
    /// from typed structs (no JSON tree), outputs embedded as they are.
    pub fn render(
        self,
        message: &Value,
        calls: &[ProviderCall],
        outcomes: &[CallOutcome],
    ) -> String {
        match self {
            Provider::Openai => openai::render(calls, outcomes),
            Provider::OpenaiResponses => openai_responses::render(calls, outcomes),
            Provider::Anthropic => anthropic::render(calls, outcomes),
            Provider::Ollama => ollama::render(calls, outcomes),
            Provider::Gemini => gemini::render(calls, outcomes),
            Provider::Toolrun => toolrun::render(message, calls, outcomes),
        }
    }
}

impl Provider {
    /// An assistant message (or API response) carrying `calls` as this provider writes
    /// it: the inverse of [`Provider::parse`], for round trips, examples and benches.
    pub fn assistant_message(self, calls: &[ProviderCall]) -> Value {
        match self {
            Provider::Openai => openai::assistant_message(calls),
            Provider::OpenaiResponses => openai_responses::assistant_message(calls),
            Provider::Anthropic => anthropic::assistant_message(calls),
            Provider::Ollama => ollama::assistant_message(calls),
            Provider::Gemini => gemini::assistant_message(calls),
            Provider::Toolrun => toolrun::assistant_message(calls),
        }
    }
}

/// Every provider name, comma separated (for error messages).
pub fn provider_names() -> String {
    Provider::ALL.map(|p| p.name()).join(", ")
}

/// One tool call as read from a provider's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderCall {
    /// The provider's id for the call (`tool_call_id`, `call_id`, `tool_use_id`); empty
    /// when the format has none (Ollama, Gemini without ids, toolrun).
    pub id: String,
    /// The tool name as the model wrote it (empty when missing: the executor answers
    /// UNKNOWN_TOOL).
    pub name: String,
    /// The arguments as JSON text, as given (OpenAI's string passes through untouched, so
    /// the executor reports invalid JSON as INVALID_ARGUMENTS for that call).
    pub arguments_json: String,
}

/// A message that cannot be run as a whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// No such provider.
    #[error("unknown provider {0:?}; providers: {names}", names = provider_names())]
    UnknownProvider(String),
    /// The body is not JSON.
    #[error("the message is not valid JSON: {0}")]
    NotJson(String),
    /// The JSON is not a message of that provider.
    #[error("not a {provider} assistant message: {message}", provider = .provider.name())]
    BadMessage {
        /// The provider.
        provider: Provider,
        /// What is wrong, with the JSON path.
        message: String,
    },
    /// A readable message without tool calls.
    #[error("the {provider} message has no tool calls", provider = .0.name())]
    NoCalls(Provider),
    /// More calls than one request may carry.
    #[error("the message has {0} tool calls; at most {MAX_CALLS} per request")]
    TooManyCalls(usize),
}

/// Parses `text` as JSON and reads `provider`'s calls from it.
pub fn parse_message(
    provider: Provider,
    text: &str,
) -> Result<(Value, Vec<ProviderCall>), ProviderError> {
    let message: Value =
        serde_json::from_str(text).map_err(|e| ProviderError::NotJson(e.to_string()))?;
    let calls = provider.parse(&message)?;
    Ok((message, calls))
}

/// The executor's requests for `calls`: the provider's id as the call id (the executor
/// makes one when empty), `session_id` on every call.
pub fn requests(
    calls: &[ProviderCall],
    session_id: &str,
    timeout_ms: u32,
    tenant: &Arc<Tenant>,
) -> Vec<CallRequest> {
    calls
        .iter()
        .map(|c| CallRequest {
            call_id: c.id.clone(),
            tool: c.name.clone(),
            arguments_json: c.arguments_json.clone(),
            timeout_ms,
            session_id: session_id.to_string(),
            tenant: Some(tenant.clone()),
        })
        .collect()
}

/// Runs `requests` concurrently through the executor; outcomes in request order.
/// Dropping the future cancels every call still running.
pub async fn execute(
    executor: &Arc<Executor>,
    parent: &CancellationToken,
    requests: Vec<CallRequest>,
) -> Vec<CallOutcome> {
    futures::future::join_all(
        requests
            .into_iter()
            .map(|r| executor.start(r, parent, false).outcome()),
    )
    .await
}

/// A message's calls, run.
#[derive(Debug)]
pub struct Ran {
    /// The outcomes, in request order.
    pub outcomes: Vec<CallOutcome>,
    /// The provider-shaped result message(s) as JSON text.
    pub results: String,
}

/// Reads `provider`'s calls from `text`, runs them in `session_id`, renders the results.
pub async fn run(
    executor: &Arc<Executor>,
    parent: &CancellationToken,
    provider: Provider,
    text: &str,
    session_id: &str,
    tenant: &Arc<Tenant>,
) -> Result<Ran, ProviderError> {
    let (message, calls) = parse_message(provider, text)?;
    let outcomes = execute(executor, parent, requests(&calls, session_id, 0, tenant)).await;
    let results = provider.render(&message, &calls, &outcomes);
    Ok(Ran { outcomes, results })
}

/// A failed call as a model reads it: `{"error": {code, details?, message}, "output"?}`
/// (`output` when the tool produced some, e.g. run_code's stderr).
#[derive(Debug, Serialize)]
pub struct ErrorResult<'a> {
    /// The typed failure.
    pub error: ErrorBody<'a>,
    /// What the tool printed before failing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<&'a RawValue>,
}

/// `{code, details?, message}`.
#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    /// The contract's code (`INVALID_ARGUMENTS`).
    pub code: &'static str,
    /// Structured details (validation errors, available tools).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<&'a Value>,
    /// For the model.
    pub message: &'a str,
}

/// The failure of `o`, if it failed.
pub fn error_result(o: &CallOutcome) -> Option<ErrorResult<'_>> {
    let e = o.error.as_ref()?;
    Some(ErrorResult {
        error: ErrorBody {
            code: e.code.as_str(),
            details: e.details.as_ref(),
            message: &e.message,
        },
        output: raw_output(o),
    })
}

/// The call's output as embedded JSON (the executor's canonical text, not re-parsed into
/// a tree), or `None` without output.
pub fn raw_output(o: &CallOutcome) -> Option<&RawValue> {
    o.output_json
        .as_deref()
        .and_then(|t| serde_json::from_str::<&RawValue>(t).ok())
}

/// A result as the text most providers carry: the canonical output JSON on success, the
/// [`ErrorResult`] JSON on failure.
pub fn result_text(o: &CallOutcome) -> String {
    match error_result(o) {
        None => o.output_json.clone().unwrap_or_else(|| "null".into()),
        Some(e) => to_json(&e),
    }
}

/// JSON text of a value that always serialises (our own structs).
pub(crate) fn to_json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("rendered results serialise")
}

/// The calls of a `tool_calls` array of `{id?, function: {name, arguments}}` objects, the
/// shape OpenAI Chat Completions and Ollama share (missing or null: no calls).
pub(crate) fn function_tool_calls(calls: Option<&Value>) -> Result<Vec<ProviderCall>, String> {
    let calls = match calls {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(other) => return Err(format!("tool_calls must be an array, got {}", kind(other))),
    };
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            if !c.is_object() {
                return Err(format!(
                    "tool_calls[{i}] must be an object, got {}",
                    kind(c)
                ));
            }
            let function = c.get("function").unwrap_or(&Value::Null);
            Ok(ProviderCall {
                id: str_field(c, "id"),
                name: str_field(function, "name"),
                arguments_json: arguments_text(function.get("arguments")),
            })
        })
        .collect()
}

/// JSON text of an argument value as a provider gave it: strings pass through untouched
/// (OpenAI's JSON-in-a-string), null or missing is empty (`{}`), anything else is
/// serialised (the executor rejects non-objects as INVALID_ARGUMENTS).
pub(crate) fn arguments_text(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// JSON text of an argument value in a format that carries objects (Anthropic `input`,
/// Gemini `args`, toolrun `input`): null or missing is empty (`{}`), anything else is
/// serialised as is (a string stays a JSON string: INVALID_ARGUMENTS "must be a JSON
/// object" from the executor).
pub(crate) fn object_arguments_text(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(other) => other.to_string(),
    }
}

/// The arguments text as a JSON value for formats that carry objects (`{}` when empty,
/// a JSON string when the text is not JSON).
pub fn arguments_value(text: &str) -> Value {
    if text.is_empty() {
        return Value::Object(Map::new());
    }
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

/// `v[key]` as a string, or empty.
pub(crate) fn str_field(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// `v[key]` as an array, or a message naming `path`.
pub(crate) fn array_field<'a>(v: &'a Value, key: &str, path: &str) -> Result<&'a [Value], String> {
    match v.get(key) {
        Some(Value::Array(a)) => Ok(a),
        Some(other) => Err(format!(
            "{path}.{key} must be an array, got {}",
            kind(other)
        )),
        None => Err(format!("{path}.{key} is missing")),
    }
}

/// The JSON type of `v`, for messages.
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Forms a tool definition can be rendered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// toolrun's own definition (all metadata).
    Native,
    /// OpenAI Chat Completions `tools` entry.
    Openai,
    /// OpenAI Responses `tools` entry.
    OpenaiResponses,
    /// Anthropic Messages API `tools` entry.
    Anthropic,
    /// Ollama `/api/chat` `tools` entry.
    Ollama,
    /// Gemini `functionDeclarations` entry.
    Gemini,
    /// Model Context Protocol `tools/list` entry.
    Mcp,
}

/// Renders one definition in `format`.
pub fn render(entry: &Entry, format: Format) -> Value {
    match format {
        Format::Native => toolrun::definition(entry),
        Format::Openai => openai::definition(entry),
        Format::OpenaiResponses => openai_responses::definition(entry),
        Format::Anthropic => anthropic::definition(entry),
        Format::Ollama => ollama::definition(entry),
        Format::Gemini => gemini::definition(entry),
        Format::Mcp => mcp::definition(entry),
    }
}

/// Whether OpenAI's strict mode accepts `schema` (Structured Outputs' supported subset):
/// every object closed (`additionalProperties: false`) with every property required, and
/// none of `allOf`, `not`, `if`/`then`/`else`, `oneOf`, `dependentRequired`,
/// `dependentSchemas`, `patternProperties`, anywhere. The root must be an object.
pub fn strict_qualifies(schema: &Value) -> bool {
    schema.get("type") == Some(&json!("object")) && strict_node(schema)
}

fn strict_node(schema: &Value) -> bool {
    const UNSUPPORTED: [&str; 9] = [
        "allOf",
        "not",
        "if",
        "then",
        "else",
        "oneOf",
        "dependentRequired",
        "dependentSchemas",
        "patternProperties",
    ];
    let Value::Object(map) = schema else {
        // `true`/`false` schemas and anything else: not in the subset.
        return false;
    };
    if UNSUPPORTED.iter().any(|k| map.contains_key(*k)) {
        return false;
    }
    let is_object = match map.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        _ => map.contains_key("properties"),
    };
    if is_object {
        if map.get("additionalProperties") != Some(&Value::Bool(false)) {
            return false;
        }
        let props = map.get("properties").and_then(Value::as_object);
        let required: Vec<&str> = map
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if let Some(props) = props {
            if !props.keys().all(|k| required.contains(&k.as_str())) {
                return false;
            }
            if !props.values().all(strict_node) {
                return false;
            }
        }
    }
    if let Some(items) = map.get("items")
        && !strict_node(items)
    {
        return false;
    }
    if let Some(Value::Array(any)) = map.get("anyOf")
        && !any.iter().all(strict_node)
    {
        return false;
    }
    for defs in ["$defs", "definitions"] {
        if let Some(Value::Object(d)) = map.get(defs)
            && !d.values().all(strict_node)
        {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_names_round_trip_and_unknown_names_list_them() {
        for p in Provider::ALL {
            assert_eq!(Provider::from_name(p.name()), Ok(p));
        }
        let e = Provider::from_name("cohere").unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("\"cohere\"") && text.contains("openai-responses, anthropic"),
            "{text}"
        );
    }

    fn sample_calls(with_ids: bool) -> Vec<ProviderCall> {
        (0..3)
            .map(|i| ProviderCall {
                id: if with_ids {
                    format!("call_{i}")
                } else {
                    String::new()
                },
                name: ["calculator", "echo", "hash"][i].into(),
                arguments_json: format!(r#"{{"n":{i},"s":"x{i}"}}"#),
            })
            .collect()
    }

    fn outcome(c: &ProviderCall, ok: bool) -> CallOutcome {
        CallOutcome {
            call_id: c.id.clone(),
            tool: c.name.clone(),
            output_json: ok.then(|| r#"{"value":4}"#.to_string()),
            output_hash: String::new(),
            error: (!ok).then(|| {
                crate::error::ToolError::new(crate::error::ErrorCode::UnknownTool, "nope")
            }),
            duration: std::time::Duration::ZERO,
        }
    }

    #[test]
    fn render_then_parse_round_trips_for_every_provider() {
        for p in Provider::ALL {
            // Ollama and toolrun messages have no ids unless given; Gemini's are optional.
            for with_ids in [true, false] {
                let calls = sample_calls(with_ids);
                let message = p.assistant_message(&calls);
                let text = message.to_string();
                let (parsed_message, parsed) = parse_message(p, &text).unwrap();
                assert_eq!(parsed, calls, "{p:?} {message}");
                assert_eq!(parsed_message, message);
            }
        }
    }

    #[test]
    fn results_come_back_in_request_order_with_each_providers_keys() {
        let calls = sample_calls(true);
        let outcomes: Vec<CallOutcome> = calls
            .iter()
            .enumerate()
            .map(|(i, c)| outcome(c, i != 1))
            .collect();
        let render = |p: Provider, m: &Value, c: &[ProviderCall], o: &[CallOutcome]| -> Value {
            serde_json::from_str(&p.render(m, c, o)).unwrap()
        };
        let r = render(Provider::Openai, &Value::Null, &calls, &outcomes);
        assert_eq!(r[1]["tool_call_id"], "call_1");
        assert_eq!(r[0]["content"], r#"{"value":4}"#);
        assert!(r[1]["content"].as_str().unwrap().contains("UNKNOWN_TOOL"));
        let r = render(Provider::OpenaiResponses, &Value::Null, &calls, &outcomes);
        assert_eq!(r[2]["type"], "function_call_output");
        assert_eq!(r[2]["call_id"], "call_2");
        let r = render(Provider::Anthropic, &Value::Null, &calls, &outcomes);
        assert_eq!(r["role"], "user");
        assert_eq!(r["content"][1]["is_error"], true);
        assert_eq!(r["content"][0]["is_error"], false);
        assert_eq!(r["content"][2]["tool_use_id"], "call_2");
        let r = render(Provider::Ollama, &Value::Null, &calls, &outcomes);
        assert_eq!(r[1]["tool_name"], "echo");
        let r = render(Provider::Gemini, &Value::Null, &calls, &outcomes);
        assert_eq!(
            r["parts"][0]["functionResponse"]["response"],
            json!({"output": {"value": 4}})
        );
        assert_eq!(
            r["parts"][1]["functionResponse"]["response"]["error"]["code"],
            "UNKNOWN_TOOL"
        );
        assert_eq!(r["parts"][2]["functionResponse"]["id"], "call_2");
        let no_ids = sample_calls(false);
        let r = render(Provider::Gemini, &Value::Null, &no_ids, &outcomes);
        assert!(r["parts"][0]["functionResponse"].get("id").is_none(), "{r}");
        let msg = Provider::Toolrun.assistant_message(&calls);
        let r = render(Provider::Toolrun, &msg, &calls, &outcomes);
        assert_eq!(r["tool_results"][1]["success"], false);
        assert_eq!(r["tool_results"][0]["output"], json!({"value": 4}));
        let single = json!({"tool_call": {"tool_id": "calculator", "input": {}}});
        let r = render(Provider::Toolrun, &single, &calls[..1], &outcomes[..1]);
        assert_eq!(r["tool_result"]["success"], true);
    }

    #[test]
    fn whole_message_errors_are_typed() {
        assert!(matches!(
            parse_message(Provider::Openai, "{"),
            Err(ProviderError::NotJson(_))
        ));
        assert!(matches!(
            parse_message(Provider::Openai, r#"{"role":"assistant","content":"hi"}"#),
            Err(ProviderError::NoCalls(Provider::Openai))
        ));
        assert!(matches!(
            parse_message(Provider::Anthropic, "[1]"),
            Err(ProviderError::BadMessage {
                provider: Provider::Anthropic,
                ..
            })
        ));
        let many: Vec<ProviderCall> = (0..MAX_CALLS + 1)
            .map(|i| ProviderCall {
                id: format!("c{i}"),
                name: "echo".into(),
                arguments_json: "{}".into(),
            })
            .collect();
        let text = Provider::Openai.assistant_message(&many).to_string();
        assert_eq!(
            parse_message(Provider::Openai, &text).unwrap_err(),
            ProviderError::TooManyCalls(MAX_CALLS + 1)
        );
    }

    #[test]
    fn strict_only_for_closed_all_required_schemas() {
        let closed = json!({
            "type": "object",
            "properties": {
                "a": {"type": "string"},
                "b": {"type": ["integer", "null"]},
                "c": {"type": "object", "properties": {"d": {"type": "boolean"}},
                      "required": ["d"], "additionalProperties": false},
                "e": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "null"}]}}
            },
            "required": ["a", "b", "c", "e"],
            "additionalProperties": false
        });
        assert!(strict_qualifies(&closed));
        // An optional property.
        let mut optional = closed.clone();
        optional["required"] = json!(["a", "c", "e"]);
        assert!(!strict_qualifies(&optional));
        // An open nested object.
        let mut open = closed.clone();
        open["properties"]["c"]
            .as_object_mut()
            .unwrap()
            .remove("additionalProperties");
        assert!(!strict_qualifies(&open));
        // An unsupported keyword deep inside.
        let mut all_of = closed.clone();
        all_of["properties"]["a"] = json!({"allOf": [{"type": "string"}]});
        assert!(!strict_qualifies(&all_of));
        let mut if_then = closed.clone();
        if_then["if"] = json!({"properties": {"a": {"const": "x"}}});
        assert!(!strict_qualifies(&if_then));
        // Not an object at the root.
        assert!(!strict_qualifies(&json!({"type": "string"})));
    }

    #[test]
    fn error_results_carry_code_message_details_and_output() {
        let o = CallOutcome {
            call_id: "c".into(),
            tool: "run_code".into(),
            output_json: Some(r#"{"stderr":"boom"}"#.into()),
            output_hash: String::new(),
            error: Some(
                crate::error::ToolError::new(crate::error::ErrorCode::ExecutionError, "exit 1")
                    .with_details(json!({"exit_code": 1})),
            ),
            duration: std::time::Duration::ZERO,
        };
        let v: Value = serde_json::from_str(&result_text(&o)).unwrap();
        assert_eq!(
            v,
            json!({"error": {"code": "EXECUTION_ERROR", "message": "exit 1",
                             "details": {"exit_code": 1}},
                   "output": {"stderr": "boom"}})
        );
    }
}
