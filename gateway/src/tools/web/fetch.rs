//! `web_fetch` (seed 002): one HTTP(S) request from the gateway, with the response's status,
//! headers, body and, for HTML, a readable text form.
//!
//! What it may reach (README "Web tools"):
//! - URLs on `web.fetch.allow` run without asking; others need approval in a session and
//!   are refused outside one (APPROVAL_REQUIRED).
//! - Never an address [`super::addr`] forbids, unless `web.fetch.allow_addresses` exempts
//!   it: IP literals are checked before the request; host names are resolved by
//!   [`GuardedResolver`], which checks every address and hands only checked ones to the
//!   connector, so the connection goes to an address that was checked (no second lookup to
//!   rebind). No proxy is ever used (it would connect on our behalf to anything).
//! - Redirects are followed by hand, each hop checked like the first URL (allowlist or the
//!   approved host, then addresses), at most `web.fetch.max_redirects`.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::time::Instant;
use url::{Host, Url};

use super::addr::Blocked;
use super::charset::{self, CharsetSource};
use super::policy::{FetchConfig, FetchPolicy};
use crate::approval::{ApprovalAsk, ApprovalKind};
use crate::error::{ErrorCode, ToolError};
use crate::tool::{
    ApprovalPolicy, CallContext, Category, Determinism, SideEffect, ToolMetadata, TypedTool,
};

/// web_fetch's timeout when the configuration sets none, ms.
pub const WEB_FETCH_TIMEOUT_MS: u64 = 30_000;

/// Longest URL accepted, bytes.
const MAX_URL_BYTES: usize = 8_192;
/// Most request headers a call may set.
const MAX_HEADERS: usize = 64;
/// Longest request header value, bytes.
const MAX_HEADER_VALUE_BYTES: usize = 8_192;
/// Width the readable text is wrapped to.
const TEXT_WIDTH: usize = 100;
/// The tool reports its own TIMEOUT (with what it received) this long before the
/// executor's backstop would.
const DEADLINE_MARGIN: Duration = Duration::from_millis(50);

/// Request headers a caller may not set: hop-by-hop headers (RFC 9110 7.6.1), the ones
/// the client computes (Host, Content-Length), and proxy credentials.
const REFUSED_HEADERS: [&str; 12] = [
    "host",
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "expect",
];

/// Headers not carried to another host on a redirect (as browsers and curl do).
const CREDENTIAL_HEADERS: [HeaderName; 3] = [
    header::AUTHORIZATION,
    header::COOKIE,
    header::WWW_AUTHENTICATE,
];

/// The request method.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum Method {
    /// GET (default).
    #[default]
    #[serde(rename = "GET")]
    Get,
    /// POST, with `body`.
    #[serde(rename = "POST")]
    Post,
}

impl Method {
    fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
        }
    }
}

/// Arguments of `web_fetch` (seed 002).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WebFetchInput {
    /// The http or https URL.
    #[schemars(length(min = 1, max = 8192))]
    pub url: String,
    /// GET (default) or POST.
    #[serde(default)]
    pub method: Method,
    /// Request headers (no hop-by-hop headers, Host or Content-Length).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Request body (POST only).
    #[serde(default)]
    pub body: Option<String>,
    /// Seconds the whole fetch may take (default and ceiling: the tool's timeout).
    #[serde(default)]
    #[schemars(range(min = 1, max = 600))]
    pub timeout: Option<u32>,
}

/// How `body` is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
pub enum BodyEncoding {
    /// The body is text, decoded to UTF-8 from `charset`.
    #[serde(rename = "utf-8")]
    Utf8,
    /// The body is not text in its declared charset nor UTF-8; standard base64 of its bytes.
    #[serde(rename = "base64")]
    Base64,
}

/// Output of `web_fetch`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct WebFetchOutput {
    /// HTTP status code.
    pub status: u16,
    /// Response headers, lowercase names; repeated headers joined with ", ".
    pub headers: BTreeMap<String, String>,
    /// Response body (cut at the configured size; see `truncated`).
    pub body: String,
    /// How `body` is encoded.
    pub body_encoding: BodyEncoding,
    /// With a text body: the character encoding it was decoded from to UTF-8, by its name
    /// in the WHATWG Encoding Standard (`UTF-8`, `windows-1252` (also for ISO-8859-1),
    /// `Shift_JIS`, `EUC-JP`, `GBK`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub charset: Option<String>,
    /// With a text body: where `charset` came from: `bom`, `content-type` (its `charset`),
    /// `meta` (an HTML page's `<meta charset>` or `http-equiv` in its first 1024 bytes), or
    /// `default` (none declared or usable: UTF-8).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub charset_source: Option<CharsetSource>,
    /// Why a declared charset was not used (unknown to the Encoding Standard, or the body
    /// is not valid in it), and what was done instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub charset_note: Option<String>,
    /// For HTML pages: the page as readable text (links as numbered references).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The body was longer than the configured size and was cut.
    pub truncated: bool,
    /// The URL that answered (after redirects).
    pub url: String,
    /// Redirects followed.
    pub redirects: u32,
}

/// Resolves host names: the system's resolver, or one a test injects.
#[async_trait]
pub trait Lookup: Send + Sync + 'static {
    /// Every address of `host`.
    async fn lookup(&self, host: &str) -> std::io::Result<Vec<IpAddr>>;
}

/// The system's resolver (getaddrinfo: /etc/hosts, then DNS).
pub struct SystemLookup;

#[async_trait]
impl Lookup for SystemLookup {
    async fn lookup(&self, host: &str) -> std::io::Result<Vec<IpAddr>> {
        Ok(tokio::net::lookup_host((host, 0))
            .await?
            .map(|a| a.ip())
            .collect())
    }
}

/// A host name that resolved to a forbidden address.
#[derive(Debug, thiserror::Error)]
#[error("{host} resolves to {ip} ({why}), which web_fetch may not reach")]
struct AddressRefused {
    host: String,
    ip: IpAddr,
    why: Blocked,
}

/// The resolver reqwest connects through: every address of a name is checked, and only
/// when all pass are they handed to the connector, which connects to those exact addresses.
struct GuardedResolver {
    lookup: Arc<dyn Lookup>,
    policy: Arc<FetchPolicy>,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let (lookup, policy) = (self.lookup.clone(), self.policy.clone());
        let host = name.as_str().to_string();
        Box::pin(async move {
            let ips = lookup.lookup(&host).await?;
            if ips.is_empty() {
                return Err(format!("{host} has no addresses").into());
            }
            // One forbidden answer refuses the name: a name that mixes public and private
            // answers is a rebinding attempt, not a host to half-trust.
            if let Some((ip, why)) = ips
                .iter()
                .find_map(|ip| policy.blocked(*ip).map(|why| (*ip, why)))
            {
                return Err(Box::new(AddressRefused { host, ip, why }) as _);
            }
            let addrs: reqwest::dns::Addrs =
                Box::new(ips.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}

/// The web_fetch tool.
pub struct WebFetch {
    client: reqwest::Client,
    policy: Arc<FetchPolicy>,
    config: FetchConfig,
    max_timeout: Duration,
}

impl WebFetch {
    /// web_fetch over `config`, resolving names with `lookup`; calls take at most
    /// `max_timeout`.
    pub fn new(
        config: &FetchConfig,
        lookup: Arc<dyn Lookup>,
        max_timeout: Duration,
    ) -> Result<WebFetch, String> {
        let policy = Arc::new(FetchPolicy::new(config).map_err(|e| e.message)?);
        let client = reqwest::Client::builder()
            .dns_resolver(Arc::new(GuardedResolver {
                lookup,
                policy: policy.clone(),
            }))
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .referer(false)
            .connect_timeout(Duration::from_millis(config.connect_timeout_ms))
            .pool_idle_timeout(Duration::from_secs(30))
            .user_agent(config.user_agent.clone())
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        Ok(WebFetch {
            client,
            policy,
            config: config.clone(),
            max_timeout,
        })
    }

    /// Parses and checks a URL: http(s), a host, no credentials.
    fn parse_url(&self, text: &str) -> Result<Url, ToolError> {
        if text.len() > MAX_URL_BYTES {
            return Err(ToolError::invalid_arguments(format!(
                "url is longer than {MAX_URL_BYTES} bytes"
            )));
        }
        let mut url = Url::parse(text)
            .map_err(|e| ToolError::invalid_arguments(format!("url {text:?}: {e}")))?;
        check_url(&url).map_err(ToolError::invalid_arguments)?;
        url.set_fragment(None);
        Ok(url)
    }

    /// Refuses an IP-literal host that may not be reached (names are checked when
    /// resolved).
    fn check_literal(&self, url: &Url) -> Result<(), ToolError> {
        let ip = match url.host() {
            Some(Host::Ipv4(ip)) => IpAddr::V4(ip),
            Some(Host::Ipv6(ip)) => IpAddr::V6(ip),
            _ => return Ok(()),
        };
        match self.policy.blocked(ip) {
            None => Ok(()),
            Some(why) => Err(refused(url.host_str().unwrap_or_default(), ip, why)),
        }
    }

    fn check_headers(&self, headers: &BTreeMap<String, String>) -> Result<HeaderMap, ToolError> {
        if headers.len() > MAX_HEADERS {
            return Err(ToolError::invalid_arguments(format!(
                "{} headers; at most {MAX_HEADERS}",
                headers.len()
            )));
        }
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            let n = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                ToolError::invalid_arguments(format!("header name {name:?} is not valid"))
            })?;
            if REFUSED_HEADERS.contains(&n.as_str()) {
                return Err(ToolError::invalid_arguments(format!(
                    "header {name:?} may not be set (hop-by-hop or computed by the client)"
                )));
            }
            if value.len() > MAX_HEADER_VALUE_BYTES {
                return Err(ToolError::invalid_arguments(format!(
                    "header {name:?} is longer than {MAX_HEADER_VALUE_BYTES} bytes"
                )));
            }
            // Refuses CR, LF and other control characters (header injection).
            let v = HeaderValue::from_str(value).map_err(|_| {
                ToolError::invalid_arguments(format!(
                    "header {name:?} has a value with control characters (CR, LF, NUL...)"
                ))
            })?;
            map.append(n, v);
        }
        Ok(map)
    }

    /// The checked request of a call, before any network traffic.
    fn prepare(&self, input: &WebFetchInput) -> Result<(Url, HeaderMap), ToolError> {
        let url = self.parse_url(&input.url)?;
        let headers = self.check_headers(&input.headers)?;
        if let Some(body) = &input.body {
            if input.method == Method::Get {
                return Err(ToolError::invalid_arguments(
                    "a body is sent with POST only",
                ));
            }
            if body.len() as u64 > self.config.max_request_bytes {
                return Err(ToolError::invalid_arguments(format!(
                    "body is {} bytes; at most {} (web.fetch.max_request_bytes)",
                    body.len(),
                    self.config.max_request_bytes
                )));
            }
        }
        self.check_literal(&url)?;
        Ok((url, headers))
    }

    async fn fetch(
        &self,
        input: WebFetchInput,
        ctx: &CallContext,
    ) -> Result<WebFetchOutput, ToolError> {
        let (mut url, mut headers) = self.prepare(&input)?;
        // In a session the approval gate has run: a URL off the allowlist was approved (or
        // the session's mode approves everything). Outside one nobody could approve it.
        let in_session = ctx.session.is_some();
        if !self.policy.allowed(&url) && !in_session {
            return Err(ToolError::new(
                ErrorCode::ApprovalRequired,
                format!(
                    "{} is not on the web_fetch allowlist (web.fetch.allow); outside a \
                     session nobody can approve it: call it in a session, or ask the \
                     operator to allow it",
                    origin(&url)
                ),
            )
            .with_details(json!({ "url": url.as_str(), "reason": "not_allowlisted" })));
        }
        // The host a human approved (or a session in mode `all` let through): redirects
        // within it need no allowlist entry.
        let approved_host = (in_session && !self.policy.allowed(&url))
            .then(|| url.host().map(|h| h.to_owned()))
            .flatten();
        let mut deadline = ctx
            .deadline
            .checked_sub(DEADLINE_MARGIN)
            .unwrap_or(ctx.deadline);
        let timeout = input.timeout.map_or(self.max_timeout, |s| {
            Duration::from_secs(u64::from(s)).min(self.max_timeout)
        });
        deadline = deadline.min(Instant::now() + timeout);
        let mut method = input.method;
        let mut body = input.body;
        let mut redirects = 0u32;
        loop {
            self.check_literal(&url)?;
            let mut req = self
                .client
                .request(
                    match method {
                        Method::Get => reqwest::Method::GET,
                        Method::Post => reqwest::Method::POST,
                    },
                    url.clone(),
                )
                .headers(headers.clone());
            if let Some(b) = &body {
                req = req.body(b.clone());
            }
            let resp = match tokio::time::timeout_at(deadline, req.send()).await {
                Err(_) => return Err(timed_out(&url, timeout, None)),
                Ok(Err(e)) => return Err(send_error(&e, &url, timeout)),
                Ok(Ok(r)) => r,
            };
            let status = resp.status();
            if status.is_redirection()
                && let Some(location) = resp.headers().get(header::LOCATION)
            {
                let next = redirect_target(&url, location)?;
                if redirects >= self.config.max_redirects {
                    return Err(ToolError::new(
                        ErrorCode::ExecutionError,
                        format!(
                            "more than {} redirects (web.fetch.max_redirects); the last \
                             pointed to {next}",
                            self.config.max_redirects
                        ),
                    )
                    .with_details(
                        json!({ "location": next.as_str(), "reason": "too_many_redirects" }),
                    ));
                }
                // A forbidden address says so, whatever the allowlist would say.
                self.check_literal(&next)?;
                // In a session the approval covered the host asked for; elsewhere only
                // the allowlist counts.
                let approved =
                    approved_host.is_some() && next.host().map(|h| h.to_owned()) == approved_host;
                if !(self.policy.allowed(&next) || approved) {
                    return Err(ToolError::new(
                        ErrorCode::ApprovalRequired,
                        format!(
                            "{url} redirects to {next}, which is not on the web_fetch \
                             allowlist: call web_fetch with that URL{}",
                            if in_session {
                                " to ask for its approval"
                            } else {
                                " in a session to ask for its approval"
                            }
                        ),
                    )
                    .with_details(json!({
                        "location": next.as_str(),
                        "status": status.as_u16(),
                        "reason": "redirect_not_allowlisted",
                    })));
                }
                if next.host() != url.host() {
                    for h in &CREDENTIAL_HEADERS {
                        headers.remove(h);
                    }
                }
                // 303, and 301/302 after POST, continue as GET without the body (RFC 9110
                // 15.4, as browsers do); 307 and 308 repeat the request.
                let code = status.as_u16();
                if code == 303 || (method == Method::Post && (code == 301 || code == 302)) {
                    method = Method::Get;
                    body = None;
                    headers.remove(header::CONTENT_TYPE);
                }
                url = next;
                redirects += 1;
                continue;
            }
            return self.read(resp, url, redirects, deadline, timeout).await;
        }
    }

    /// Reads the response body up to the size cap and builds the output.
    async fn read(
        &self,
        mut resp: reqwest::Response,
        url: Url,
        redirects: u32,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<WebFetchOutput, ToolError> {
        let status = resp.status().as_u16();
        let mut headers: BTreeMap<String, String> = BTreeMap::new();
        for (name, value) in resp.headers() {
            let v = String::from_utf8_lossy(value.as_bytes());
            headers
                .entry(name.as_str().to_string())
                .and_modify(|old| {
                    old.push_str(", ");
                    old.push_str(&v);
                })
                .or_insert_with(|| v.into_owned());
        }
        let cap = self.config.max_response_bytes as usize;
        let mut bytes: Vec<u8> = Vec::new();
        let mut truncated = false;
        loop {
            let chunk = match tokio::time::timeout_at(deadline, resp.chunk()).await {
                Err(_) => return Err(timed_out(&url, timeout, Some((status, bytes.len())))),
                Ok(Err(e)) if e.is_timeout() => {
                    return Err(timed_out(&url, timeout, Some((status, bytes.len()))));
                }
                Ok(Err(e)) => {
                    return Err(ToolError::new(
                        ErrorCode::ExecutionError,
                        format!("reading the response of {url}: {}", chain(&e)),
                    )
                    .with_details(json!({ "status": status, "bytes_received": bytes.len() })));
                }
                Ok(Ok(None)) => break,
                Ok(Ok(Some(c))) => c,
            };
            let room = cap - bytes.len();
            if chunk.len() > room {
                bytes.extend_from_slice(&chunk[..room]);
                // Dropping the response closes the connection: the rest is never read.
                truncated = true;
                break;
            }
            bytes.extend_from_slice(&chunk);
        }
        let content_type = headers
            .get("content-type")
            .map(|c| c.to_ascii_lowercase())
            .unwrap_or_default();
        let is_html =
            content_type.starts_with("text/html") || content_type.starts_with("application/xhtml");
        let decoded = charset::decode(&bytes, &content_type, is_html, truncated);
        let (body, body_encoding, charset, charset_source) = match decoded.text {
            Some((text, encoding)) => (
                text,
                BodyEncoding::Utf8,
                Some(encoding.name().to_string()),
                Some(decoded.source),
            ),
            None => (
                base64::engine::general_purpose::STANDARD.encode(&bytes),
                BodyEncoding::Base64,
                None,
                None,
            ),
        };
        let utf8 = body_encoding == BodyEncoding::Utf8;
        // The text form renders the decoded page (any <meta charset> in it is now moot).
        let text = if is_html && utf8 && nesting_depth(&body) <= MAX_TEXT_NESTING {
            // Rendering gets what is left of the call's time; past it the page comes
            // without its text form.
            tokio::time::timeout_at(deadline, html_text(body.clone()))
                .await
                .ok()
        } else {
            None
        };
        Ok(WebFetchOutput {
            status,
            headers,
            body,
            body_encoding,
            charset,
            charset_source,
            charset_note: decoded.note,
            text,
            truncated,
            url: url.to_string(),
            redirects,
        })
    }
}

/// Deepest element nesting of a page rendered as text: the renderer's time grows
/// steeply with depth, and real pages stay far below this.
const MAX_TEXT_NESTING: usize = 512;

/// Elements that never hold others, or whose end tag may be left out: not counted.
const UNNESTED: [&str; 22] = [
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
    "wbr", "p", "li", "dt", "dd", "tr", "td", "th", "option", "!",
];

/// An upper estimate of a page's element nesting, from its tags alone (a scan, no parse).
fn nesting_depth(html: &str) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    let b = html.as_bytes();
    let mut i = 0;
    while let Some(off) = b[i..].iter().position(|&c| c == b'<') {
        i += off + 1;
        match b.get(i) {
            Some(b'/') => depth = depth.saturating_sub(1),
            Some(c) if c.is_ascii_alphabetic() || *c == b'!' => {
                let end = b[i..]
                    .iter()
                    .position(|c| c.is_ascii_whitespace() || *c == b'>' || *c == b'/')
                    .map_or(b.len(), |e| i + e);
                let name = html[i..end].to_ascii_lowercase();
                let close = b[i..]
                    .iter()
                    .position(|&c| c == b'>')
                    .map_or(b.len(), |e| i + e);
                let self_closing = close > 0 && b.get(close - 1) == Some(&b'/');
                if !self_closing
                    && !UNNESTED
                        .iter()
                        .any(|u| name.starts_with(u) && (name == *u || *u == "!"))
                {
                    depth += 1;
                    max = max.max(depth);
                }
            }
            _ => {}
        }
    }
    max
}

/// Renders HTML as wrapped text on a thread of its own: the renderer recurses over the
/// document tree, so a deeply nested page needs a deep stack, which the runtime's threads
/// do not have. A page the renderer cannot handle yields an empty text, not a failure.
async fn html_text(html: String) -> String {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("web-fetch-text".into())
        // Virtual size: only the pages a deep document touches are committed.
        .stack_size(256 << 20)
        .spawn(move || {
            let text = html2text::config::plain()
                .string_from_read(html.as_bytes(), TEXT_WIDTH)
                .unwrap_or_default();
            let _ = tx.send(text);
        });
    match spawned {
        Ok(_) => rx.await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Checks a parsed URL: http(s), a host, no user or password.
fn check_url(url: &Url) -> Result<(), String> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "scheme {:?} is not allowed: only http and https",
            url.scheme()
        ));
    }
    if url.host().is_none() {
        return Err(format!("{url} has no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("credentials in the URL are not allowed; send an Authorization header".into());
    }
    Ok(())
}

/// The next URL of a redirect, checked like a call's URL.
fn redirect_target(from: &Url, location: &HeaderValue) -> Result<Url, ToolError> {
    let refuse = |why: String| {
        ToolError::new(
            ErrorCode::PermissionDenied,
            format!("{from} redirects to a URL web_fetch does not follow: {why}"),
        )
        .with_details(json!({ "reason": "bad_redirect" }))
    };
    let loc = location
        .to_str()
        .map_err(|_| refuse("the Location header is not text".into()))?;
    let mut next = from
        .join(loc)
        .map_err(|e| refuse(format!("{loc:?}: {e}")))?;
    check_url(&next).map_err(refuse)?;
    next.set_fragment(None);
    Ok(next)
}

fn origin(url: &Url) -> String {
    url.origin().ascii_serialization()
}

fn refused(host: &str, ip: IpAddr, why: Blocked) -> ToolError {
    ToolError::new(
        ErrorCode::PermissionDenied,
        format!(
            "{host} is {ip} ({why}): web_fetch never reaches loopback, private, link-local, \
             unique-local, shared, multicast, reserved or cloud-metadata addresses"
        ),
    )
    .with_details(json!({
        "reason": "blocked_address",
        "address": ip.to_string(),
        "range": why.as_str(),
    }))
}

fn timed_out(url: &Url, timeout: Duration, received: Option<(u16, usize)>) -> ToolError {
    let mut e = ToolError::new(
        ErrorCode::Timeout,
        format!("fetching {url} took longer than {} ms", timeout.as_millis()),
    );
    if let Some((status, bytes)) = received {
        e = e.with_details(json!({ "status": status, "bytes_received": bytes }));
    }
    e
}

/// The error and its sources, joined (reqwest's own message is only the outer layer).
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

/// A failed send as a typed result: a forbidden address (from the resolver), a timeout,
/// or a connection failure.
fn send_error(e: &reqwest::Error, url: &Url, timeout: Duration) -> ToolError {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(inner) = src {
        if let Some(r) = inner.downcast_ref::<AddressRefused>() {
            return refused(&r.host, r.ip, r.why);
        }
        src = inner.source();
    }
    if e.is_timeout() {
        return timed_out(url, timeout, None);
    }
    let what = if e.is_connect() {
        "cannot connect to"
    } else {
        "request failed for"
    };
    ToolError::new(
        ErrorCode::ExecutionError,
        format!("{what} {}: {}", origin(url), chain(e)),
    )
    .with_details(json!({ "reason": if e.is_connect() { "connect" } else { "request" } }))
}

/// web_fetch's metadata (also of its disabled stand-in).
pub fn web_fetch_metadata() -> ToolMetadata {
    ToolMetadata {
        id: "web_fetch".into(),
        name: "Web Fetch".into(),
        description: "Fetches an http(s) URL (GET, or POST with a body) and returns the \
            status, headers and body; HTML pages also come as readable text. Bodies are \
            cut at a size limit (truncated: true). URLs on the operator's allowlist run \
            at once; others need the user's approval in a session. Private, loopback \
            and cloud-metadata addresses are never reached."
            .into(),
        version: "1.0.0",
        category: Category::Search,
        sandbox_required: false,
        // Reads the web (a POST can change things elsewhere: it asks like any URL off
        // the allowlist).
        side_effect: SideEffect::Pure,
        determinism: Determinism::NonDeterministic,
        // Tenants need the `network` capability (auth.tenants.*.capabilities).
        required_capabilities: &["network"],
        approval: ApprovalPolicy::Conditional,
        max_memory_bytes: None,
    }
}

impl TypedTool for WebFetch {
    type Input = WebFetchInput;
    type Output = WebFetchOutput;

    fn metadata(&self) -> ToolMetadata {
        web_fetch_metadata()
    }

    fn default_timeout_ms(&self) -> u64 {
        WEB_FETCH_TIMEOUT_MS
    }

    async fn approval(
        &self,
        input: &WebFetchInput,
        _args: &Value,
        _ctx: &CallContext,
    ) -> Result<Option<ApprovalAsk>, ToolError> {
        // A request that cannot run is refused before anyone is asked.
        let (url, _) = self.prepare(input)?;
        if self.policy.allowed(&url) {
            return Ok(None);
        }
        Ok(Some(ApprovalAsk {
            kind: match input.method {
                Method::Get => ApprovalKind::Read,
                Method::Post => ApprovalKind::Write,
            },
            reason: format!(
                "web_fetch {} {url}: {} is not on the allowlist (web.fetch.allow){}",
                input.method.as_str(),
                origin(&url),
                input
                    .body
                    .as_ref()
                    .map(|b| format!(", with a body of {} bytes", b.len()))
                    .unwrap_or_default()
            ),
        }))
    }

    async fn run(
        &self,
        input: WebFetchInput,
        ctx: &CallContext,
    ) -> Result<WebFetchOutput, ToolError> {
        self.fetch(input, ctx).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_is_estimated_from_tags() {
        assert_eq!(
            nesting_depth("<html><body><div><p>a<p>b<br></div></body></html>"),
            3
        );
        assert_eq!(nesting_depth("<!doctype html><img src=x /><div/>"), 0);
        assert_eq!(nesting_depth(&"<div>".repeat(1000)), 1000);
        assert_eq!(nesting_depth("a < b"), 0);
    }
}
