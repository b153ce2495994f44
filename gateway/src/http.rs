//! The HTTP listener (`toolrun serve --mcp-listen`, default `127.0.0.1:8080`): one axum
//! [`Router`] that serves MCP at `/mcp` ([`crate::mcp`]) and the provider formats at
//! `POST /v1/{provider}/tool-calls` ([`crate::providers::http`]), each a thin adapter over
//! the executor, like gRPC.
//!
//! Every route passes the same guard first:
//! - `Host` must be one of `mcp.allowed_hosts` and a browser's `Origin` one of
//!   `mcp.allowed_origins` (defaults: loopback only), else `403` naming the header. A page on
//!   another site, or a DNS-rebound name, cannot drive a gateway on loopback
//!   (SECURITY-CASES.md 53).
//! - Request bodies are bounded by the gateway's message size (`--max-message-bytes`, the
//!   gRPC limit too): `413` (for `/mcp` with a message naming the limit, see
//!   [`crate::mcp::intake`]; axum's extractors on other routes).
//!
//! Before the guard, requests open at once are bounded (`--max-open-http-requests`,
//! [`crate::inflight`]): one more is `429` with `Retry-After` at once, nothing queued. After
//! authentication, each tenant's own share (`limits.open_http_requests`) likewise.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{ConfigError, McpConfig};
use crate::exec::Executor;
use crate::inflight::OpenHttpRequestsLayer;

/// What the listener needs besides the executor.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// Largest request body, bytes (the gRPC message limit).
    pub max_body_bytes: usize,
    /// Host and Origin rules.
    pub guard: Arc<Guard>,
    /// The bound on requests open at once (`--max-open-http-requests`).
    pub open_requests: OpenHttpRequestsLayer,
}

impl HttpSettings {
    /// Settings from the `mcp:` section; a malformed host or origin names its key.
    pub fn new(
        config: &McpConfig,
        max_body_bytes: usize,
        max_open_requests: usize,
    ) -> Result<Self, ConfigError> {
        Ok(HttpSettings {
            max_body_bytes,
            guard: Arc::new(Guard::new(config)?),
            open_requests: OpenHttpRequestsLayer::new(max_open_requests),
        })
    }
}

/// The listener's routes: MCP at `/mcp` and the provider formats at
/// `/v1/{provider}/tool-calls`, behind the Host/Origin guard and the body bound.
pub fn router(
    executor: Arc<Executor>,
    hard_stop: CancellationToken,
    settings: &HttpSettings,
    auth: Arc<crate::auth::Auth>,
) -> Router {
    let providers =
        crate::providers::http::router(Arc::new(crate::providers::http::ProviderHttp {
            executor: executor.clone(),
            hard_stop: hard_stop.clone(),
            max_body_bytes: settings.max_body_bytes,
        }));
    let routes = Router::new()
        .merge(crate::mcp::router(
            executor,
            hard_stop,
            settings.max_body_bytes,
        ))
        .merge(providers)
        .layer(axum::middleware::from_fn_with_state(
            auth,
            crate::auth::require_key,
        ));
    guarded(routes, settings)
}

/// `routes` behind the guard: requests open at once bounded (first, so a refusal costs
/// nothing), Host and Origin checked, bodies bounded (axum extractors included).
pub fn guarded(routes: Router, settings: &HttpSettings) -> Router {
    routes
        .layer(DefaultBodyLimit::max(settings.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(
            settings.guard.clone(),
            check_host_and_origin,
        ))
        .layer(settings.open_requests.clone())
}

/// Serves `router` on `listener` until `stop` fires (then lets open requests finish).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    stop: CancellationToken,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    // Small JSON answers must not wait for Nagle's algorithm.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(stop.cancelled_owned())
    .await
}

/// As [`serve`], over TLS: `listener` hands over connections after their handshake, each
/// request carrying its [`crate::auth::tls::PeerInfo`] (the client certificate's names).
pub async fn serve_tls(
    listener: crate::auth::tls::TlsListener,
    router: Router,
    stop: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<crate::auth::tls::PeerInfo>(),
    )
    .with_graceful_shutdown(stop.cancelled_owned())
    .await
}

async fn check_host_and_origin(
    State(guard): State<Arc<Guard>>,
    req: Request,
    next: Next,
) -> Response {
    if let Err(why) = guard.check(&req) {
        tracing::warn!(reason = %why, path = req.uri().path(), "refused an HTTP request (Host/Origin)");
        let message = format!("Forbidden: {why}");
        // MCP clients show a JSON-RPC error's message; others get text.
        if req.uri().path().starts_with("/mcp") {
            return (
                StatusCode::FORBIDDEN,
                [(http::header::CONTENT_TYPE, "application/json")],
                serde_json::json!({
                    "jsonrpc": "2.0", "id": null,
                    "error": {"code": -32600, "message": message}
                })
                .to_string(),
            )
                .into_response();
        }
        return (StatusCode::FORBIDDEN, format!("{message}\n")).into_response();
    }
    next.run(req).await
}

/// The Host and Origin rules of the listener.
#[derive(Debug)]
pub struct Guard {
    hosts: Option<Vec<HostRule>>,
    origins: Option<Vec<OriginRule>>,
}

#[derive(Debug, PartialEq, Eq)]
struct HostRule {
    host: String,
    port: Option<u16>,
}

#[derive(Debug, PartialEq, Eq)]
enum OriginRule {
    Null,
    Tuple {
        scheme: String,
        host: String,
        /// `None` = any port (`:*`).
        port: Option<u16>,
    },
}

impl Guard {
    /// Parses the rules; `*` allows anything.
    pub fn new(config: &McpConfig) -> Result<Self, ConfigError> {
        let invalid = |key: &str, i: usize, message: String| ConfigError::Invalid {
            key: format!("mcp.{key}[{i}]"),
            message,
        };
        if config.allowed_hosts.is_empty() {
            return Err(ConfigError::Invalid {
                key: "mcp.allowed_hosts".into(),
                message: "is empty: list the names clients use, or \"*\" behind a proxy that \
                          checks Host"
                    .into(),
            });
        }
        let hosts = if config.allowed_hosts.iter().any(|h| h == "*") {
            None
        } else {
            Some(
                config
                    .allowed_hosts
                    .iter()
                    .enumerate()
                    .map(|(i, h)| parse_host_rule(h).map_err(|m| invalid("allowed_hosts", i, m)))
                    .collect::<Result<_, _>>()?,
            )
        };
        let origins = if config.allowed_origins.iter().any(|o| o == "*") {
            None
        } else {
            Some(
                config
                    .allowed_origins
                    .iter()
                    .enumerate()
                    .map(|(i, o)| {
                        parse_origin_rule(o).map_err(|m| invalid("allowed_origins", i, m))
                    })
                    .collect::<Result<_, _>>()?,
            )
        };
        Ok(Guard { hosts, origins })
    }

    /// Why `req` is refused, if it is.
    pub fn check<B>(&self, req: &http::Request<B>) -> Result<(), String> {
        if let Some(rules) = &self.hosts {
            let authority = match req.headers().get(http::header::HOST) {
                Some(v) => v
                    .to_str()
                    .ok()
                    .and_then(|s| s.parse::<http::uri::Authority>().ok())
                    .ok_or_else(|| "the Host header is malformed".to_string())?,
                // HTTP/2 carries it as :authority.
                None => req
                    .uri()
                    .authority()
                    .cloned()
                    .ok_or_else(|| "the request names no Host".to_string())?,
            };
            let host = normalize_host(authority.host());
            let port = authority.port_u16();
            if !rules
                .iter()
                .any(|r| r.host == host && r.port.is_none_or(|p| Some(p) == port))
            {
                return Err(format!(
                    "Host {:?} is not allowed (mcp.allowed_hosts)",
                    shorten(authority.as_str())
                ));
            }
        }
        if let (Some(rules), Some(origin)) =
            (&self.origins, req.headers().get(http::header::ORIGIN))
        {
            let text = origin
                .to_str()
                .map_err(|_| "the Origin header is malformed".to_string())?;
            let allowed = match parse_origin(text) {
                Some(Origin::Null) => rules.contains(&OriginRule::Null),
                Some(Origin::Tuple { scheme, host, port }) => rules.iter().any(|r| match r {
                    OriginRule::Null => false,
                    OriginRule::Tuple {
                        scheme: s,
                        host: h,
                        port: p,
                    } => *s == scheme && *h == host && p.is_none_or(|p| p == port),
                }),
                None => return Err("the Origin header is malformed".into()),
            };
            if !allowed {
                return Err(format!(
                    "Origin {:?} is not allowed (mcp.allowed_origins)",
                    shorten(text)
                ));
            }
        }
        Ok(())
    }
}

fn shorten(s: &str) -> &str {
    let mut end = s.len().min(200);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn normalize_host(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

fn parse_host_rule(rule: &str) -> Result<HostRule, String> {
    let rule = rule.trim();
    // A bare IPv6 address ("::1") is a host without a port.
    if rule.matches(':').count() > 1 && !rule.starts_with('[') {
        return match rule.parse::<std::net::Ipv6Addr>() {
            Ok(_) => Ok(HostRule {
                host: rule.to_ascii_lowercase(),
                port: None,
            }),
            Err(_) => Err(format!("{rule:?} is not a host name, address or host:port")),
        };
    }
    let authority: http::uri::Authority = rule
        .parse()
        .map_err(|_| format!("{rule:?} is not a host name, address or host:port"))?;
    if authority.as_str().contains('@') || authority.host().is_empty() {
        return Err(format!("{rule:?} is not a host name, address or host:port"));
    }
    Ok(HostRule {
        host: normalize_host(authority.host()),
        port: authority.port_u16(),
    })
}

enum Origin {
    Null,
    Tuple {
        scheme: String,
        host: String,
        port: u16,
    },
}

/// An `Origin` header value: `null` or `scheme://host[:port]` (the port defaulted from the
/// scheme).
fn parse_origin(text: &str) -> Option<Origin> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("null") {
        return Some(Origin::Null);
    }
    let uri: http::Uri = text.parse().ok()?;
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let authority = uri.authority()?;
    if uri
        .path_and_query()
        .is_some_and(|p| !p.as_str().is_empty() && p.as_str() != "/")
    {
        return None;
    }
    let port = match (authority.port_u16(), scheme.as_str()) {
        (Some(p), _) => p,
        (None, "http" | "ws") => 80,
        (None, "https" | "wss") => 443,
        (None, _) => 0,
    };
    Some(Origin::Tuple {
        host: normalize_host(authority.host()),
        scheme,
        port,
    })
}

fn parse_origin_rule(rule: &str) -> Result<OriginRule, String> {
    let rule = rule.trim();
    let bad = || {
        format!(
            "{rule:?} is not an origin (scheme://host, scheme://host:port, scheme://host:*, null)"
        )
    };
    let (base, any_port) = match rule.strip_suffix(":*") {
        Some(base) => (base, true),
        None => (rule, false),
    };
    if any_port {
        // `scheme://host:*` only: no port of its own.
        let uri: http::Uri = base.parse().map_err(|_| bad())?;
        if uri.authority().and_then(|a| a.port_u16()).is_some() {
            return Err(bad());
        }
    }
    match parse_origin(base) {
        Some(Origin::Null) if !any_port => Ok(OriginRule::Null),
        Some(Origin::Tuple { scheme, host, port }) => Ok(OriginRule::Tuple {
            scheme,
            host,
            port: (!any_port).then_some(port),
        }),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(hosts: &[&str], origins: &[&str]) -> Guard {
        Guard::new(&McpConfig {
            allowed_hosts: hosts.iter().map(|s| s.to_string()).collect(),
            allowed_origins: origins.iter().map(|s| s.to_string()).collect(),
        })
        .unwrap()
    }

    fn req(host: Option<&str>, origin: Option<&str>) -> http::Request<()> {
        let mut b = http::Request::builder().uri("/mcp");
        if let Some(h) = host {
            b = b.header("host", h);
        }
        if let Some(o) = origin {
            b = b.header("origin", o);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn the_defaults_allow_loopback_only() {
        let g = Guard::new(&McpConfig::default()).unwrap();
        for host in ["127.0.0.1:8080", "localhost", "LOCALHOST:1", "[::1]:8080"] {
            assert!(g.check(&req(Some(host), None)).is_ok(), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.2:8080",
            "10.0.0.1",
        ] {
            let e = g.check(&req(Some(host), None)).unwrap_err();
            assert!(e.contains("mcp.allowed_hosts"), "{e}");
        }
        assert!(g.check(&req(None, None)).is_err(), "no Host at all");
        // Browsers on loopback pages pass; any other site is refused; no Origin passes.
        assert!(
            g.check(&req(Some("localhost"), Some("http://localhost:3000")))
                .is_ok()
        );
        assert!(
            g.check(&req(Some("localhost"), Some("http://127.0.0.1")))
                .is_ok()
        );
        let e = g
            .check(&req(Some("localhost"), Some("https://evil.example")))
            .unwrap_err();
        assert!(e.contains("mcp.allowed_origins"), "{e}");
        assert!(g.check(&req(Some("localhost"), Some("null"))).is_err());
        assert!(
            g.check(&req(Some("localhost"), Some("not an origin")))
                .is_err()
        );
    }

    #[test]
    fn ports_and_wildcards() {
        let g = guard(
            &["toolrun.svc:8080", "toolrun"],
            &["https://app.example", "http://dev.example:*"],
        );
        assert!(g.check(&req(Some("toolrun.svc:8080"), None)).is_ok());
        assert!(g.check(&req(Some("toolrun.svc:9090"), None)).is_err());
        assert!(g.check(&req(Some("toolrun:1234"), None)).is_ok());
        let ok = |o| g.check(&req(Some("toolrun"), Some(o))).is_ok();
        assert!(ok("https://app.example"));
        assert!(ok("https://app.example:443"));
        assert!(
            !ok("https://app.example:8443"),
            "a port-less rule means the default port"
        );
        assert!(!ok("http://app.example"));
        assert!(ok("http://dev.example:5173"));
        let any = guard(&["*"], &["*"]);
        assert!(
            any.check(&req(Some("anything.example"), Some("https://x.example")))
                .is_ok()
        );
    }

    #[test]
    fn bad_rules_name_their_key() {
        let err = |hosts: &[&str], origins: &[&str]| {
            Guard::new(&McpConfig {
                allowed_hosts: hosts.iter().map(|s| s.to_string()).collect(),
                allowed_origins: origins.iter().map(|s| s.to_string()).collect(),
            })
            .unwrap_err()
            .to_string()
        };
        assert!(err(&[], &[]).contains("mcp.allowed_hosts"));
        assert!(err(&["a b"], &[]).contains("mcp.allowed_hosts[0]"));
        assert!(err(&["ok", "user@host"], &[]).contains("mcp.allowed_hosts[1]"));
        assert!(err(&["ok"], &["example.com"]).contains("mcp.allowed_origins[0]"));
        assert!(err(&["ok"], &["https://a.example:1:*"]).contains("mcp.allowed_origins[0]"));
        assert!(err(&["ok"], &["https://a.example/path"]).contains("mcp.allowed_origins[0]"));
    }
}
