//! The tool registry: every tool once, by id and alias, with its configuration and its
//! compiled argument validator.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::config::Config;
use crate::tool::Tool;

/// Registration failures.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Two tools (or a tool and an alias) share a name.
    #[error("duplicate tool id or alias {0:?}")]
    Duplicate(String),
    /// A tool's input schema is not a valid JSON Schema.
    #[error("tool {id}: invalid input schema: {message}")]
    BadSchema {
        /// The tool.
        id: String,
        /// What is wrong.
        message: String,
    },
    /// The configuration names a tool that does not exist.
    #[error("config: tools.{0}: no such tool")]
    UnknownConfiguredTool(String),
}

/// A registered tool with everything needed to call it.
pub struct Entry {
    /// The implementation.
    pub tool: Arc<dyn Tool>,
    /// Enabled by configuration.
    pub enabled: bool,
    /// Longest a call may take.
    pub timeout: Duration,
    /// Compiled input schema.
    pub validator: jsonschema::Validator,
    /// Compiled output schema.
    pub output_validator: jsonschema::Validator,
    /// Other names this tool answers to.
    pub aliases: Vec<String>,
}

impl Entry {
    /// The tool's id.
    pub fn id(&self) -> &'static str {
        self.tool.metadata().id
    }
}

/// All tools, by id and alias.
#[derive(Default)]
pub struct Registry {
    entries: Vec<Arc<Entry>>,
    by_name: HashMap<String, Arc<Entry>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tool, applying its configuration; rejects duplicate ids and aliases.
    pub fn register(
        &mut self,
        tool: Arc<dyn Tool>,
        aliases: &[&str],
        config: &Config,
    ) -> Result<(), RegistryError> {
        let id = tool.metadata().id;
        let names: Vec<&str> = std::iter::once(id).chain(aliases.iter().copied()).collect();
        for name in &names {
            if self.by_name.contains_key(*name) {
                return Err(RegistryError::Duplicate((*name).to_string()));
            }
        }
        let validator = jsonschema::validator_for(tool.input_schema()).map_err(|e| {
            RegistryError::BadSchema {
                id: id.to_string(),
                message: e.to_string(),
            }
        })?;
        let output_validator = jsonschema::validator_for(tool.output_schema()).map_err(|e| {
            RegistryError::BadSchema {
                id: id.to_string(),
                message: format!("output schema: {e}"),
            }
        })?;
        let tool_config = config.tool(id);
        let entry = Arc::new(Entry {
            enabled: tool_config.is_none_or(|c| c.enabled),
            timeout: Duration::from_millis(
                tool_config
                    .and_then(|c| c.timeout_ms)
                    .unwrap_or(tool.default_timeout_ms()),
            ),
            validator,
            output_validator,
            aliases: aliases.iter().map(|a| a.to_string()).collect(),
            tool,
        });
        for name in names {
            self.by_name.insert(name.to_string(), entry.clone());
        }
        self.entries.push(entry);
        Ok(())
    }

    /// Fails when the configuration names a tool that is neither registered nor in `also_known`.
    pub fn check_config(&self, config: &Config, also_known: &[&str]) -> Result<(), RegistryError> {
        for id in config.tools.keys() {
            if !self.entries.iter().any(|e| e.id() == id) && !also_known.contains(&id.as_str()) {
                return Err(RegistryError::UnknownConfiguredTool(id.clone()));
            }
        }
        Ok(())
    }

    /// The tool called `name` (id or alias).
    pub fn get(&self, name: &str) -> Option<&Arc<Entry>> {
        self.by_name.get(name)
    }

    /// Every tool, in registration order.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Entry>> {
        self.entries.iter()
    }

    /// Every enabled tool, in registration order.
    pub fn enabled(&self) -> impl Iterator<Item = &Arc<Entry>> {
        self.entries.iter().filter(|e| e.enabled)
    }
}

/// Provider forms a definition can be rendered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// toolrun's own definition (all metadata).
    Native,
    /// OpenAI function-calling `tools` entry.
    Openai,
    /// Anthropic Messages API `tools` entry.
    Anthropic,
    /// Model Context Protocol `tools/list` entry.
    Mcp,
}

/// Renders one definition in `format`.
pub fn render(entry: &Entry, format: Format) -> Value {
    let m = entry.tool.metadata();
    let input = entry.tool.input_schema();
    let output = entry.tool.output_schema();
    match format {
        Format::Native => json!({
            "id": m.id,
            "name": m.name,
            "description": m.description,
            "version": m.version,
            "category": m.category,
            "input_schema": input,
            "output_schema": output,
            "sandbox_required": m.sandbox_required,
            "side_effect": m.side_effect,
            "determinism": m.determinism,
            "approval_policy": m.approval,
            "timeout_ms": entry.timeout.as_millis() as u64,
            "required_capabilities": m.required_capabilities,
            "aliases": entry.aliases,
        }),
        Format::Openai => json!({
            "type": "function",
            "function": {
                "name": m.id,
                "description": m.description,
                "parameters": input,
            }
        }),
        Format::Anthropic => json!({
            "name": m.id,
            "description": m.description,
            "input_schema": input,
        }),
        Format::Mcp => json!({
            "name": m.id,
            "title": m.name,
            "description": m.description,
            "inputSchema": input,
            "outputSchema": output,
            "annotations": {
                "title": m.name,
                "readOnlyHint": m.side_effect == crate::tool::SideEffect::Pure,
                "idempotentHint": m.determinism == crate::tool::Determinism::Deterministic,
                "openWorldHint": false,
            }
        }),
    }
}
