//! The tool registry: every tool once, by id and alias, with its configuration and its
//! compiled argument validator. Definitions are checked by [`crate::validation`] on
//! registration; rendering them for providers lives in [`crate::providers`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::tool::Tool;
use crate::validation::{DefinitionError, compile, validate_definition};

/// Moved to [`crate::providers`]; re-exported for existing callers.
pub use crate::providers::{Format, render};

/// Registration failures.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Two tools (or a tool and an alias) share a name.
    #[error("duplicate tool id or alias {0:?}")]
    Duplicate(String),
    /// A tool's definition is refused: name, input schema, or a schema that does not
    /// compile.
    #[error(transparent)]
    Invalid(#[from] DefinitionError),
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
    /// Why the tool is disabled (configuration, or a tool that cannot run as configured,
    /// e.g. web_search without a provider); `None` when enabled.
    pub disabled_reason: Option<String>,
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
    pub fn id(&self) -> &str {
        &self.tool.metadata().id
    }
}

/// All tools, by id and alias. Cloning shares the entries: a gateway derives the registry
/// with its custom tools from the built-ins' one on each reload.
#[derive(Default, Clone)]
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
        self.register_with(tool, aliases, config, None)
    }

    /// Adds a tool that cannot run as configured: listed as disabled with `reason`, its
    /// calls refused with TOOL_DISABLED and the reason.
    pub fn register_disabled(
        &mut self,
        tool: Arc<dyn Tool>,
        aliases: &[&str],
        config: &Config,
        reason: String,
    ) -> Result<(), RegistryError> {
        self.register_with(tool, aliases, config, Some(reason))
    }

    fn register_with(
        &mut self,
        tool: Arc<dyn Tool>,
        aliases: &[&str],
        config: &Config,
        unavailable: Option<String>,
    ) -> Result<(), RegistryError> {
        let id = tool.metadata().id.to_string();
        let tool_config = config.tool(&id);
        let disabled_reason = if tool_config.is_some_and(|c| !c.enabled) {
            Some(format!(
                "disabled by configuration (tools.{id}.enabled: false)"
            ))
        } else {
            unavailable
        };
        let timeout = Duration::from_millis(
            tool_config
                .and_then(|c| c.timeout_ms)
                .unwrap_or(tool.default_timeout_ms()),
        );
        self.insert_entry(tool, aliases, disabled_reason, timeout)
    }

    /// Adds a tool with its own timeout (a custom tool, whose declaration carries it);
    /// rejects duplicate ids and aliases and invalid definitions.
    pub fn insert(
        &mut self,
        tool: Arc<dyn Tool>,
        aliases: &[&str],
        enabled: bool,
        timeout: Duration,
    ) -> Result<(), RegistryError> {
        let reason = (!enabled).then(|| "disabled by its declaration".to_string());
        self.insert_entry(tool, aliases, reason, timeout)
    }

    fn insert_entry(
        &mut self,
        tool: Arc<dyn Tool>,
        aliases: &[&str],
        disabled_reason: Option<String>,
        timeout: Duration,
    ) -> Result<(), RegistryError> {
        let id: &str = &tool.metadata().id;
        let names: Vec<&str> = std::iter::once(id).chain(aliases.iter().copied()).collect();
        for name in &names {
            if self.by_name.contains_key(*name) {
                return Err(RegistryError::Duplicate((*name).to_string()));
            }
        }
        let validator = validate_definition(id, tool.input_schema())?;
        let output_validator = compile(id, "output", tool.output_schema())?;
        let names: Vec<String> = names.into_iter().map(String::from).collect();
        let entry = Arc::new(Entry {
            enabled: disabled_reason.is_none(),
            disabled_reason,
            timeout,
            validator,
            output_validator,
            aliases: aliases.iter().map(|a| a.to_string()).collect(),
            tool,
        });
        for name in names {
            self.by_name.insert(name, entry.clone());
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
