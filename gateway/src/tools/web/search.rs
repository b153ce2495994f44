//! `web_search` (seed 000): a query to the operator's search provider, results as
//! `{title, url, snippet}`.
//!
//! Providers: a SearXNG instance's JSON API and the Brave Search API. The provider is
//! trusted configuration (not subject to web_fetch's allowlist), still bounded: connect
//! timeout, the tool's timeout, and a cap on the response read. Every failure is a typed
//! result: TIMEOUT, UNAVAILABLE (unreachable, HTTP error), EXECUTION_ERROR (an answer that
//! is not the provider's JSON), OUTPUT_LIMIT (an answer over the cap).

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use url::Url;

use super::policy::{BRAVE_URL, SearchConfig, SearchProviderKind};
use crate::error::{ErrorCode, ToolError};
use crate::tool::{
    ApprovalPolicy, CallContext, Category, Determinism, SideEffect, ToolMetadata, TypedTool,
};

/// web_search's timeout when the configuration sets none, ms.
pub const WEB_SEARCH_TIMEOUT_MS: u64 = 10_000;

/// Longest snippet returned, characters.
const MAX_SNIPPET_CHARS: usize = 1_000;

fn default_num_results() -> u8 {
    5
}

/// Arguments of `web_search` (seed 000).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WebSearchInput {
    /// What to search for.
    #[schemars(length(min = 1, max = 500))]
    pub query: String,
    /// How many results (1-10, default 5).
    #[serde(default = "default_num_results")]
    #[schemars(range(min = 1, max = 10))]
    pub num_results: u8,
}

/// One result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct SearchResult {
    /// Page title.
    pub title: String,
    /// Page URL.
    pub url: String,
    /// Text from the page about the query.
    pub snippet: String,
}

/// Output of `web_search`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct WebSearchOutput {
    /// The results, best first (at most `num_results`).
    pub results: Vec<SearchResult>,
}

/// A configured provider.
#[derive(Debug, Clone)]
enum Provider {
    Searxng { base: Url },
    Brave { endpoint: Url, key: String },
}

/// The web_search tool.
pub struct WebSearch {
    client: reqwest::Client,
    provider: Provider,
    max_response_bytes: usize,
}

impl WebSearch {
    /// web_search over `config`, or why it cannot run (the tool is then listed as
    /// disabled with that reason). The API key is read from the environment now.
    pub fn new(config: &SearchConfig) -> Result<WebSearch, String> {
        let parse = |u: &str| Url::parse(u).map_err(|e| format!("web.search.url {u:?}: {e}"));
        let provider = match config.provider {
            None => {
                return Err(
                    "no search provider is configured (web.search.provider: searxng or brave)"
                        .into(),
                );
            }
            Some(SearchProviderKind::Searxng) => Provider::Searxng {
                base: parse(config.url.as_deref().ok_or("web.search.url is not set")?)?,
            },
            Some(SearchProviderKind::Brave) => {
                let var = &config.api_key_env;
                let key = std::env::var(var)
                    .ok()
                    .filter(|k| !k.trim().is_empty())
                    .ok_or_else(|| {
                        format!(
                            "the Brave Search API key is not set: environment variable {var} \
                             (web.search.api_key_env) is empty or missing"
                        )
                    })?;
                Provider::Brave {
                    endpoint: parse(config.url.as_deref().unwrap_or(BRAVE_URL))?,
                    key: key.trim().to_string(),
                }
            }
        };
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(config.connect_timeout_ms))
            .redirect(reqwest::redirect::Policy::limited(3))
            .user_agent(concat!("toolrun-web-search/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        Ok(WebSearch {
            client,
            provider,
            max_response_bytes: config.max_response_bytes as usize,
        })
    }

    fn name(&self) -> &'static str {
        match self.provider {
            Provider::Searxng { .. } => "searxng",
            Provider::Brave { .. } => "brave",
        }
    }

    fn request(&self, query: &str, n: u8) -> reqwest::RequestBuilder {
        match &self.provider {
            Provider::Searxng { base } => {
                let mut url = base.clone();
                // The instance may live under a path (`https://host/searx/`).
                let path = format!("{}/search", url.path().trim_end_matches('/'));
                url.set_path(&path);
                url.query_pairs_mut()
                    .append_pair("q", query)
                    .append_pair("format", "json")
                    .append_pair("pageno", "1");
                self.client.get(url).header("accept", "application/json")
            }
            Provider::Brave { endpoint, key } => self
                .client
                .get(endpoint.clone())
                .query(&[("q", query), ("count", &n.to_string())])
                .header("accept", "application/json")
                .header("x-subscription-token", key),
        }
    }

    async fn search(
        &self,
        input: WebSearchInput,
        ctx: &CallContext,
    ) -> Result<WebSearchOutput, ToolError> {
        let query = input.query.trim();
        if query.is_empty() {
            return Err(ToolError::invalid_arguments("query is blank"));
        }
        let provider = self.name();
        let deadline = ctx
            .deadline
            .checked_sub(Duration::from_millis(50))
            .unwrap_or(ctx.deadline);
        let timed_out = || {
            ToolError::new(
                ErrorCode::Timeout,
                format!("the search provider ({provider}) did not answer in time"),
            )
            .with_details(json!({ "provider": provider }))
        };
        let unavailable = |msg: String, status: Option<u16>| {
            ToolError::new(
                ErrorCode::Unavailable,
                format!("the search provider ({provider}) failed: {msg}"),
            )
            .with_details(json!({ "provider": provider, "status": status }))
        };
        let send = self.request(query, input.num_results).send();
        let mut resp = match tokio::time::timeout_at(deadline, send).await {
            Err(_) => return Err(timed_out()),
            Ok(Err(e)) if e.is_timeout() => return Err(timed_out()),
            Ok(Err(e)) => return Err(unavailable(chain(&e), None)),
            Ok(Ok(r)) => r,
        };
        let status = resp.status();
        let mut body = Vec::new();
        loop {
            match tokio::time::timeout_at(deadline, resp.chunk()).await {
                Err(_) => return Err(timed_out()),
                Ok(Err(e)) => return Err(unavailable(chain(&e), Some(status.as_u16()))),
                Ok(Ok(None)) => break,
                Ok(Ok(Some(c))) => {
                    if body.len() + c.len() > self.max_response_bytes {
                        return Err(ToolError::new(
                            ErrorCode::OutputLimit,
                            format!(
                                "the search provider ({provider}) answered more than {} bytes \
                                 (web.search.max_response_bytes)",
                                self.max_response_bytes
                            ),
                        ));
                    }
                    body.extend_from_slice(&c);
                }
            }
        }
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            let excerpt: String = text.chars().take(300).collect();
            return Err(unavailable(
                format!("HTTP {status}: {excerpt}"),
                Some(status.as_u16()),
            ));
        }
        let mut results = parse_results(provider, &body)?;
        results.truncate(usize::from(input.num_results));
        Ok(WebSearchOutput { results })
    }
}

/// SearXNG's `/search?format=json` answer (the fields used).
#[derive(Deserialize)]
struct SearxngAnswer {
    results: Vec<SearxngResult>,
}

#[derive(Deserialize)]
struct SearxngResult {
    url: String,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    content: Option<String>,
}

/// Brave Search API's web search answer (the fields used); `web` is absent when nothing
/// matched.
#[derive(Deserialize)]
struct BraveAnswer {
    #[serde(default)]
    web: Option<BraveWeb>,
}

#[derive(Deserialize)]
struct BraveWeb {
    #[serde(default)]
    results: Vec<BraveResult>,
}

#[derive(Deserialize)]
struct BraveResult {
    url: String,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    description: Option<String>,
}

/// Parses a provider's JSON into results.
fn parse_results(provider: &str, body: &[u8]) -> Result<Vec<SearchResult>, ToolError> {
    let bad = |e: serde_json::Error| {
        ToolError::new(
            ErrorCode::ExecutionError,
            format!("the search provider ({provider}) answered something other than its JSON: {e}"),
        )
        .with_details(json!({ "provider": provider }))
    };
    let results = match provider {
        "searxng" => serde_json::from_slice::<SearxngAnswer>(body)
            .map_err(bad)?
            .results
            .into_iter()
            .map(|r| (r.title, r.url, r.content))
            .collect::<Vec<_>>(),
        _ => serde_json::from_slice::<BraveAnswer>(body)
            .map_err(bad)?
            .web
            .map(|w| w.results)
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.title, r.url, r.description))
            .collect(),
    };
    Ok(results
        .into_iter()
        .map(|(title, url, snippet)| SearchResult {
            title: plain(title.as_deref().unwrap_or_default()),
            url,
            snippet: plain(snippet.as_deref().unwrap_or_default()),
        })
        .collect())
}

/// Provider text as plain text: Brave marks matches with `<strong>` and escapes entities.
fn plain(s: &str) -> String {
    let text = if s.contains(['<', '&']) {
        html2text::config::plain_no_decorate()
            .string_from_read(s.as_bytes(), 10_000)
            .map(|t| t.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|_| s.to_string())
    } else {
        s.trim().to_string()
    };
    match text.char_indices().nth(MAX_SNIPPET_CHARS) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text,
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        let t = inner.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = inner.source();
    }
    s
}

impl TypedTool for WebSearch {
    type Input = WebSearchInput;
    type Output = WebSearchOutput;

    fn metadata(&self) -> ToolMetadata {
        web_search_metadata()
    }

    fn default_timeout_ms(&self) -> u64 {
        WEB_SEARCH_TIMEOUT_MS
    }

    async fn run(
        &self,
        input: WebSearchInput,
        ctx: &CallContext,
    ) -> Result<WebSearchOutput, ToolError> {
        self.search(input, ctx).await
    }
}

/// web_search's metadata (also of its disabled stand-in).
pub fn web_search_metadata() -> ToolMetadata {
    ToolMetadata {
        id: "web_search".into(),
        name: "Web Search".into(),
        description: "Searches the web and returns up to num_results (1-10, default 5) \
            results, each with title, url and snippet."
            .into(),
        version: "1.0.0",
        category: Category::Search,
        sandbox_required: false,
        side_effect: SideEffect::Pure,
        determinism: Determinism::NonDeterministic,
        // Tenants need the `network` capability (auth.tenants.*.capabilities).
        required_capabilities: &["network"],
        approval: ApprovalPolicy::Never,
        max_memory_bytes: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn searxng_and_brave_answers_parse_to_plain_results() {
        let searxng = br#"{"query":"rust","number_of_results":0,"results":[
            {"url":"https://www.rust-lang.org/","title":"Rust","content":"A language &amp; more","engine":"duckduckgo","engines":["duckduckgo"],"score":1.0,"category":"general","parsed_url":["https","www.rust-lang.org","/","","",""],"template":"default.html","positions":[1],"publishedDate":null,"thumbnail":null},
            {"url":"https://doc.rust-lang.org/","title":"Docs","engine":"bing"}],
            "answers":[],"corrections":[],"infoboxes":[],"suggestions":["rust lang"],"unresponsive_engines":[]}"#;
        let r = parse_results("searxng", searxng).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].snippet, "A language & more");
        assert_eq!(r[1].snippet, "");
        let brave = br#"{"type":"search","query":{"original":"rust"},"mixed":{"type":"mixed","main":[]},
            "web":{"type":"search","family_friendly":true,"results":[
            {"type":"search_result","title":"Rust <strong>Programming</strong>","url":"https://www.rust-lang.org/","is_source_local":false,"description":"A <strong>language</strong> empowering everyone &#x27;to build&#x27;","profile":{"name":"Rust"},"language":"en","age":"2 days ago"}]}}"#;
        let r = parse_results("brave", brave).unwrap();
        assert_eq!(r[0].title, "Rust Programming");
        assert_eq!(r[0].snippet, "A language empowering everyone 'to build'");
        assert!(
            parse_results("brave", br#"{"type":"search"}"#)
                .unwrap()
                .is_empty()
        );
        let e = parse_results("searxng", b"<html>").unwrap_err();
        assert_eq!(e.code, ErrorCode::ExecutionError);
    }
}
