//! The built-in tools.

pub mod calculator;
pub mod custom;
pub mod custom_kube;
pub mod custom_reload;
pub mod echo;
pub mod files;
pub mod hash;
pub mod run_code;
pub mod shell;
pub mod web;

use std::sync::Arc;

use crate::config::Config;
use crate::registry::{Registry, RegistryError};
use crate::tool::typed;

/// Ids of the tools that need a sandbox backend.
pub const SANDBOXED_TOOLS: &[&str] = &["run_code", "code_executor", "shell"];

/// Ids of the tools that work in a session (the file tools and shell).
pub const SESSION_TOOLS: &[&str] = &[
    "read_file",
    "write_file",
    "list_directory",
    "delete_file",
    "move_file",
    "glob",
    "grep",
    "edit",
    "shell",
];

/// A registry with the inline built-ins (no sandboxed tools), the web tools included.
pub fn inline_registry(config: &Config) -> Result<Registry, RegistryError> {
    let mut r = Registry::new();
    r.register(typed(calculator::Calculator), &[], config)?;
    r.register(typed(echo::Echo), &[], config)?;
    r.register(typed(hash::Hash), &[], config)?;
    web::register(&mut r, config, std::sync::Arc::new(web::SystemLookup))?;
    Ok(r)
}

/// The inline built-ins, plus the file tools when `sessions` are served.
pub fn inline_with_files(config: &Config, sessions: bool) -> Result<Registry, RegistryError> {
    let mut r = inline_registry(config)?;
    if sessions {
        files::register(&mut r, config)?;
    }
    Ok(r)
}

/// Every built-in: the inline tools, the file tools and shell when `sessions` are served,
/// and the sandboxed ones on `pool`.
pub fn builtin_registry(
    config: &Config,
    pool: Arc<run_code::SandboxPool>,
    sessions: bool,
) -> Result<Registry, RegistryError> {
    let mut r = inline_with_files(config, sessions)?;
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
    let run_code = run_code::with_language_enum(typed(run_code), &config.sandbox);
    r.register(run_code, &[], config)?;
    let seed = run_code::RunCode::new(pool.clone(), limits("code_executor"), max("code_executor"));
    let seed = run_code::with_language_enum(typed(run_code::CodeExecutor(seed)), &config.sandbox);
    r.register(seed, &[], config)?;
    if sessions {
        let shell_max = std::time::Duration::from_millis(
            config
                .tool("shell")
                .and_then(|c| c.timeout_ms)
                .unwrap_or(crate::config::MAX_SHELL_TIMEOUT_MS),
        );
        r.register(
            typed(shell::Shell::new(pool, limits("shell"), shell_max)),
            &[],
            config,
        )?;
    }
    r.check_config(config, SESSION_TOOLS)?;
    Ok(r)
}
