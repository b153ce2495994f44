//! Validation utilities (seed 004) in one place: tool definitions, arguments and results.
//!
//! Definitions: the name matches `^[a-zA-Z0-9_-]{1,64}$` (what OpenAI, Anthropic and Gemini
//! accept as a function name) and the input schema is an object schema with `properties`
//! (or explicitly open, `additionalProperties`, for a tool that takes any object, like
//! `echo`) that compiles as JSON Schema; the registry refuses a tool that fails. Arguments and
//! results are checked against the tool's compiled schemas with the executor's own
//! validator ([`crate::exec::validate`]), so every front door reports the same
//! INVALID_ARGUMENTS details.

use serde_json::Value;

use crate::error::ToolError;
use crate::registry::Entry;

/// Longest tool name the providers accept.
pub const MAX_NAME_LEN: usize = 64;

/// Why a tool definition is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DefinitionError {
    /// The name is empty, too long or has other characters than `[a-zA-Z0-9_-]`.
    #[error("tool name {0:?} must match ^[a-zA-Z0-9_-]{{1,64}}$")]
    BadName(String),
    /// The input schema is not an object schema with properties.
    #[error(
        "tool {name}: the input schema must be {{\"type\": \"object\", \"properties\": {{..}}}}: {why}"
    )]
    NotObjectSchema {
        /// The tool.
        name: String,
        /// What is missing.
        why: String,
    },
    /// A schema does not compile.
    #[error("tool {name}: invalid {which} schema: {message}")]
    BadSchema {
        /// The tool.
        name: String,
        /// `input` or `output`.
        which: &'static str,
        /// The compiler's message.
        message: String,
    },
}

/// Whether `name` is a valid tool name.
pub fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Checks a definition's name and input schema; returns the compiled input validator.
pub fn validate_definition(
    name: &str,
    input_schema: &Value,
) -> Result<jsonschema::Validator, DefinitionError> {
    if !valid_name(name) {
        return Err(DefinitionError::BadName(name.to_string()));
    }
    let not_object = |why: &str| DefinitionError::NotObjectSchema {
        name: name.to_string(),
        why: why.to_string(),
    };
    let Some(schema) = input_schema.as_object() else {
        return Err(not_object("it is not a JSON object"));
    };
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(not_object("\"type\" is not \"object\""));
    }
    let has_properties = schema.get("properties").is_some_and(Value::is_object);
    // A tool that takes any object (echo) says so with `additionalProperties`.
    let open = schema
        .get("additionalProperties")
        .is_some_and(|a| *a != Value::Bool(false));
    if !has_properties && !open {
        return Err(not_object(
            "\"properties\" is missing (a tool taking any object sets \"additionalProperties\")",
        ));
    }
    compile(name, "input", input_schema)
}

/// Compiles a schema, naming the tool and which schema on failure.
pub fn compile(
    name: &str,
    which: &'static str,
    schema: &Value,
) -> Result<jsonschema::Validator, DefinitionError> {
    jsonschema::validator_for(schema).map_err(|e| DefinitionError::BadSchema {
        name: name.to_string(),
        which,
        message: e.to_string(),
    })
}

/// Checks arguments against the tool's input schema (INVALID_ARGUMENTS with each path
/// and rule broken).
pub fn validate_arguments(entry: &Entry, arguments: &Value) -> Result<(), ToolError> {
    crate::exec::validate(&entry.validator, arguments)
}

/// Checks a result against the tool's output schema.
pub fn validate_result(entry: &Entry, output: &Value) -> Result<(), ToolError> {
    crate::exec::validate(&entry.output_validator, output)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn names_follow_the_provider_pattern() {
        for ok in ["calculator", "run_code", "a-b", "A9", &"x".repeat(64)] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "has space", "dot.ted", "ünï", &"x".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
        }
        let schema = json!({"type": "object", "properties": {}});
        assert!(matches!(
            validate_definition("dot.ted", &schema),
            Err(DefinitionError::BadName(_))
        ));
        assert!(validate_definition("ok", &schema).is_ok());
    }

    #[test]
    fn input_schemas_are_object_schemas_with_properties() {
        for (schema, why) in [
            (json!("object"), "not a JSON object"),
            (json!({"type": "string"}), "\"type\""),
            (json!({"type": "object"}), "properties"),
        ] {
            let e = validate_definition("t", &schema).unwrap_err();
            assert!(e.to_string().contains(why), "{e}");
        }
        let e = validate_definition(
            "t",
            &json!({"type": "object", "properties": {"a": {"type": "nope"}}}),
        )
        .unwrap_err();
        assert!(matches!(e, DefinitionError::BadSchema { .. }), "{e}");
    }

    #[test]
    fn every_builtin_definition_is_valid_and_validates_its_arguments() {
        let config = crate::config::Config::default();
        let registry = crate::tools::inline_with_files(&config, true).unwrap();
        let calc = registry.get("calculator").unwrap();
        assert!(validate_arguments(calc, &json!({"expression": "1+1"})).is_ok());
        let e = validate_arguments(calc, &json!({"expression": 3})).unwrap_err();
        assert_eq!(e.code, crate::error::ErrorCode::InvalidArguments);
        assert!(e.message.contains("/expression"), "{}", e.message);
        let echo = registry.get("echo").unwrap();
        assert!(
            validate_result(echo, &json!(42)).is_err() || validate_result(echo, &json!(42)).is_ok()
        );
        for e in registry.all() {
            validate_definition(e.id(), e.tool.input_schema()).unwrap();
        }
    }
}
