//! The built-in tools.

pub mod calculator;
pub mod echo;
pub mod hash;
pub mod run_code;

use std::sync::Arc;

use crate::config::Config;
use crate::registry::{Registry, RegistryError};
use crate::tool::typed;

/// Ids of the tools that need a sandbox backend.
pub const SANDBOXED_TOOLS: &[&str] = &["run_code", "code_executor"];

/// A registry with the inline built-ins (no sandboxed tools).
pub fn inline_registry(config: &Config) -> Result<Registry, RegistryError> {
    let mut r = Registry::new();
    r.register(typed(calculator::Calculator), &[], config)?;
    r.register(typed(echo::Echo), &[], config)?;
    r.register(typed(hash::Hash), &[], config)?;
    Ok(r)
}

/// Every built-in: the inline tools, and the sandboxed ones on `pool`.
pub fn builtin_registry(
    config: &Config,
    pool: Arc<run_code::SandboxPool>,
) -> Result<Registry, RegistryError> {
    let mut r = inline_registry(config)?;
    let max = |id: &str| {
        std::time::Duration::from_millis(
            config
                .tool(id)
                .and_then(|c| c.timeout_ms)
                .unwrap_or(run_code::RUN_CODE_TIMEOUT_MS),
        )
    };
    let limits = |id: &str| {
        config
            .sandbox
            .limits
            .merged(config.tool(id).and_then(|c| c.limits.as_ref()))
    };
    let run_code = run_code::RunCode::new(pool.clone(), limits("run_code"), max("run_code"));
    r.register(typed(run_code), &[], config)?;
    let seed = run_code::RunCode::new(pool, limits("code_executor"), max("code_executor"));
    r.register(typed(run_code::CodeExecutor(seed)), &[], config)?;
    r.check_config(config, &[])?;
    Ok(r)
}
