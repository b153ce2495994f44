//! The web tools, run inline in the gateway (never in a sandbox, which has no network):
//! `web_fetch` ([`fetch`]) and `web_search` ([`search`]), configured by the `web` section
//! ([`policy::WebConfig`]).

pub mod addr;
pub mod charset;
pub mod fetch;
pub mod policy;
pub mod search;

use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::error::{ErrorCode, ToolError};
use crate::registry::{Registry, RegistryError};
use crate::tool::{CallContext, ToolMetadata, TypedTool, typed};

pub use fetch::{Lookup, SystemLookup, WebFetch};
pub use policy::WebConfig;
pub use search::WebSearch;

/// Registers web_fetch and web_search, resolving web_fetch's host names with `lookup`.
/// A tool that cannot run as configured (no search provider, no API key) is registered
/// disabled, with the reason ListTools and its calls report.
pub fn register(
    r: &mut Registry,
    config: &Config,
    lookup: Arc<dyn Lookup>,
) -> Result<(), RegistryError> {
    let max = |id: &str, default: u64| {
        Duration::from_millis(
            config
                .tool(id)
                .and_then(|c| c.timeout_ms)
                .unwrap_or(default),
        )
    };
    let fetch_max = max("web_fetch", fetch::WEB_FETCH_TIMEOUT_MS);
    match WebFetch::new(&config.web.fetch, lookup, fetch_max) {
        Ok(t) => r.register(typed(t), &[], config)?,
        Err(why) => r.register_disabled(typed(Unavailable::fetch()), &[], config, why)?,
    }
    match WebSearch::new(&config.web.search) {
        Ok(t) => r.register(typed(t), &[], config)?,
        Err(why) => r.register_disabled(typed(Unavailable::search()), &[], config, why)?,
    }
    Ok(())
}

/// A web tool that cannot run as configured: its definition is listed (disabled), its
/// calls are refused by the executor before they reach it.
struct Unavailable<I, O> {
    metadata: ToolMetadata,
    _types: std::marker::PhantomData<fn(I) -> O>,
}

impl Unavailable<fetch::WebFetchInput, fetch::WebFetchOutput> {
    fn fetch() -> Self {
        Unavailable {
            metadata: fetch::web_fetch_metadata(),
            _types: std::marker::PhantomData,
        }
    }
}

impl Unavailable<search::WebSearchInput, search::WebSearchOutput> {
    fn search() -> Self {
        Unavailable {
            metadata: search::web_search_metadata(),
            _types: std::marker::PhantomData,
        }
    }
}

impl<I, O> TypedTool for Unavailable<I, O>
where
    I: serde::de::DeserializeOwned + schemars::JsonSchema + Send + Sync + 'static,
    O: serde::Serialize + schemars::JsonSchema + Send + Sync + 'static,
{
    type Input = I;
    type Output = O;

    fn metadata(&self) -> ToolMetadata {
        self.metadata.clone()
    }

    async fn run(&self, _input: I, _ctx: &CallContext) -> Result<O, ToolError> {
        Err(ToolError::new(
            ErrorCode::ToolDisabled,
            format!("{} is not configured", self.metadata.id),
        ))
    }
}
