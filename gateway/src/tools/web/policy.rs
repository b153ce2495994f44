//! The configuration of the web tools (`web` in toolrun.yaml) and web_fetch's policy built
//! from it: the URL allowlist and the addresses exempt from the never-reachable rule.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use url::{Host, Url};

use super::addr::{Blocked, classify};

/// The `web` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebConfig {
    /// web_fetch.
    pub fetch: FetchConfig,
    /// web_search.
    pub search: SearchConfig,
}

/// `web.fetch`: what web_fetch may reach without approval, and its bounds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FetchConfig {
    /// URLs fetched without approval, as `[scheme://]host[:port]`: no scheme allows http
    /// and https; `*.example.com` allows every subdomain (not example.com itself); `*`
    /// allows every host; no port allows the scheme's default port, `:*` any port. Other
    /// URLs need approval in a session and are refused outside one. Empty by default.
    pub allow: Vec<String>,
    /// Addresses or CIDRs exempt from the never-reachable rule (loopback, private,
    /// link-local, metadata...): for tests, or an internal service meant to be fetched.
    /// Empty by default.
    pub allow_addresses: Vec<String>,
    /// Response body bytes kept (more is cut and flagged `truncated`), 1 KiB..=32 MiB.
    pub max_response_bytes: u64,
    /// Request body bytes accepted (POST), 0..=16 MiB.
    pub max_request_bytes: u64,
    /// Connection timeout, ms (100..=60000); the whole fetch is bounded by the tool's
    /// timeout and the call's `timeout`.
    pub connect_timeout_ms: u64,
    /// Redirects followed, each checked like the first URL (0..=20).
    pub max_redirects: u32,
    /// User-Agent sent unless the call sets one.
    pub user_agent: String,
}

impl Default for FetchConfig {
    fn default() -> Self {
        FetchConfig {
            allow: Vec::new(),
            allow_addresses: Vec::new(),
            max_response_bytes: 1 << 20,
            max_request_bytes: 1 << 20,
            connect_timeout_ms: 5_000,
            max_redirects: 5,
            user_agent: concat!("toolrun-web-fetch/", env!("CARGO_PKG_VERSION")).to_string(),
        }
    }
}

/// Which search service web_search asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SearchProviderKind {
    /// A SearXNG instance's JSON API (`/search?format=json`; the instance must enable the
    /// json format in its `search.formats`).
    Searxng,
    /// Brave Search API (`/res/v1/web/search`, key in `X-Subscription-Token`).
    Brave,
}

/// Brave Search API's web search endpoint.
pub const BRAVE_URL: &str = "https://api.search.brave.com/res/v1/web/search";

/// `web.search`: the provider (trusted, operator-configured: not subject to web_fetch's
/// allowlist, still bounded in time and size).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SearchConfig {
    /// The provider; none (default): web_search is listed as disabled.
    pub provider: Option<SearchProviderKind>,
    /// The provider's base URL: required for searxng (e.g. `http://searxng:8080`); brave
    /// defaults to its public endpoint.
    pub url: Option<String>,
    /// Environment variable holding the API key (brave; default `BRAVE_SEARCH_API_KEY`).
    pub api_key_env: String,
    /// Largest provider response read, bytes (1 KiB..=32 MiB).
    pub max_response_bytes: u64,
    /// Connection timeout, ms (100..=60000).
    pub connect_timeout_ms: u64,
}

impl Default for SearchConfig {
    fn default() -> Self {
        SearchConfig {
            provider: None,
            url: None,
            api_key_env: "BRAVE_SEARCH_API_KEY".into(),
            max_response_bytes: 2 << 20,
            connect_timeout_ms: 5_000,
        }
    }
}

/// A configuration problem: the key and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// Dotted key under `web`.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

fn invalid(key: &str, message: impl Into<String>) -> Invalid {
    Invalid {
        key: format!("web.{key}"),
        message: message.into(),
    }
}

impl WebConfig {
    /// Checks every key (patterns parse, ranges hold).
    pub fn validate(&self) -> Result<(), Invalid> {
        FetchPolicy::new(&self.fetch)?;
        let f = &self.fetch;
        let checks: [(&str, u64, u64, u64); 5] = [
            (
                "fetch.max_response_bytes",
                f.max_response_bytes,
                1024,
                32 << 20,
            ),
            ("fetch.max_request_bytes", f.max_request_bytes, 0, 16 << 20),
            (
                "fetch.connect_timeout_ms",
                f.connect_timeout_ms,
                100,
                60_000,
            ),
            ("fetch.max_redirects", u64::from(f.max_redirects), 0, 20),
            (
                "search.max_response_bytes",
                self.search.max_response_bytes,
                1024,
                32 << 20,
            ),
        ];
        for (key, value, lo, hi) in checks {
            if !(lo..=hi).contains(&value) {
                return Err(invalid(key, format!("{value} is out of range {lo}..={hi}")));
            }
        }
        if !(100..=60_000).contains(&self.search.connect_timeout_ms) {
            return Err(invalid(
                "search.connect_timeout_ms",
                format!(
                    "{} is out of range 100..=60000",
                    self.search.connect_timeout_ms
                ),
            ));
        }
        if http::HeaderValue::from_str(&f.user_agent).is_err() {
            return Err(invalid("fetch.user_agent", "not a valid header value"));
        }
        if let Some(url) = &self.search.url {
            match Url::parse(url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
                _ => {
                    return Err(invalid(
                        "search.url",
                        format!("{url:?} is not an http(s) URL"),
                    ));
                }
            }
        }
        if self.search.provider == Some(SearchProviderKind::Searxng) && self.search.url.is_none() {
            return Err(invalid(
                "search.url",
                "searxng needs the instance's URL (e.g. http://searxng:8080)",
            ));
        }
        Ok(())
    }
}

/// Which ports a pattern allows.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PortRule {
    /// The scheme's default port.
    Default,
    /// Any port.
    Any,
    /// This port.
    Exactly(u16),
}

/// Which hosts a pattern allows.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostRule {
    /// Every host.
    Any,
    /// Exactly this host.
    Exactly(Host<String>),
    /// Subdomains of this domain (`*.example.com`).
    SubdomainsOf(String),
}

/// One parsed `web.fetch.allow` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowRule {
    scheme: Option<String>,
    host: HostRule,
    port: PortRule,
}

impl AllowRule {
    /// Parses `[scheme://]host[:port]`.
    pub fn parse(pattern: &str) -> Result<AllowRule, String> {
        let (scheme, rest) = match pattern.split_once("://") {
            Some((s, rest)) => {
                let s = s.to_ascii_lowercase();
                if s != "http" && s != "https" {
                    return Err(format!("scheme {s:?}: only http and https"));
                }
                (Some(s), rest)
            }
            None => (None, pattern),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.is_empty() || rest.contains(['/', '@', '?', '#']) {
            return Err("expected [scheme://]host[:port], without user, path or query".into());
        }
        // The port follows the last ':' outside an IPv6 literal's brackets.
        let (host, port) = match rest.rfind(':') {
            Some(i) if !rest[i..].contains(']') => (&rest[..i], Some(&rest[i + 1..])),
            _ => (rest, None),
        };
        let port = match port {
            None => PortRule::Default,
            Some("*") => PortRule::Any,
            Some(p) => PortRule::Exactly(p.parse().map_err(|_| format!("bad port {p:?}"))?),
        };
        let host = if host == "*" {
            HostRule::Any
        } else if let Some(domain) = host.strip_prefix("*.") {
            match Host::parse(domain) {
                Ok(Host::Domain(d)) => HostRule::SubdomainsOf(d.trim_end_matches('.').into()),
                Ok(_) => return Err(format!("{host:?}: a wildcard needs a domain name")),
                Err(e) => return Err(format!("{host:?}: {e}")),
            }
        } else {
            match Host::parse(host) {
                Ok(Host::Domain(d)) => {
                    HostRule::Exactly(Host::Domain(d.trim_end_matches('.').into()))
                }
                Ok(h) => HostRule::Exactly(h),
                Err(e) => return Err(format!("{host:?}: {e}")),
            }
        };
        Ok(AllowRule { scheme, host, port })
    }

    /// Whether the rule allows `url` (an http(s) URL with a host).
    pub fn allows(&self, url: &Url) -> bool {
        if self.scheme.as_deref().is_some_and(|s| s != url.scheme()) {
            return false;
        }
        let port_ok = match self.port {
            PortRule::Any => true,
            PortRule::Default => url.port().is_none(),
            PortRule::Exactly(p) => url.port_or_known_default() == Some(p),
        };
        if !port_ok {
            return false;
        }
        let Some(host) = url.host() else {
            return false;
        };
        match (&self.host, host) {
            (HostRule::Any, _) => true,
            (HostRule::Exactly(Host::Domain(want)), Host::Domain(d)) => {
                d.trim_end_matches('.') == want
            }
            (HostRule::Exactly(want), h) => *want == h.to_owned(),
            (HostRule::SubdomainsOf(suffix), Host::Domain(d)) => d
                .trim_end_matches('.')
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            (HostRule::SubdomainsOf(_), _) => false,
        }
    }
}

/// web_fetch's policy: the allowlist and the exempt address ranges.
#[derive(Debug, Clone, Default)]
pub struct FetchPolicy {
    allow: Vec<AllowRule>,
    exempt: Vec<IpNet>,
}

impl FetchPolicy {
    /// Parses `web.fetch.allow` and `web.fetch.allow_addresses`.
    pub fn new(c: &FetchConfig) -> Result<FetchPolicy, Invalid> {
        let allow = c
            .allow
            .iter()
            .enumerate()
            .map(|(i, p)| AllowRule::parse(p).map_err(|e| invalid(&format!("fetch.allow[{i}]"), e)))
            .collect::<Result<_, _>>()?;
        let exempt = c
            .allow_addresses
            .iter()
            .enumerate()
            .map(|(i, a)| {
                a.parse::<IpNet>()
                    .or_else(|_| a.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| {
                        invalid(
                            &format!("fetch.allow_addresses[{i}]"),
                            format!("{a:?} is neither an address nor a CIDR"),
                        )
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(FetchPolicy { allow, exempt })
    }

    /// Whether `url` is on the allowlist.
    pub fn allowed(&self, url: &Url) -> bool {
        self.allow.iter().any(|r| r.allows(url))
    }

    /// Why `ip` may not be reached (`None`: public, or exempt by configuration).
    pub fn blocked(&self, ip: IpAddr) -> Option<Blocked> {
        let why = classify(ip)?;
        // An exemption written for an IPv4 address also covers its v4-mapped form.
        let v4 = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        let exempt = self
            .exempt
            .iter()
            .any(|n| n.contains(&ip) || v4.is_some_and(|v4| n.contains(&v4)));
        (!exempt).then_some(why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allows(pattern: &str, url: &str) -> bool {
        AllowRule::parse(pattern)
            .unwrap()
            .allows(&Url::parse(url).unwrap())
    }

    #[test]
    fn patterns_match_scheme_host_and_port() {
        assert!(allows("docs.rs", "https://docs.rs/serde"));
        assert!(allows("docs.rs", "http://DOCS.rs./x"));
        assert!(!allows("docs.rs", "https://docs.rs:8443/"));
        assert!(!allows("docs.rs", "https://evil-docs.rs/"));
        assert!(!allows("docs.rs", "https://docs.rs.evil.com/"));
        assert!(allows("https://docs.rs", "https://docs.rs/"));
        assert!(!allows("https://docs.rs", "http://docs.rs/"));
        assert!(allows("*.example.com", "https://a.b.example.com/"));
        assert!(!allows("*.example.com", "https://example.com/"));
        assert!(!allows("*.example.com", "https://badexample.com/"));
        assert!(allows("http://127.0.0.1:*", "http://127.0.0.1:34567/"));
        assert!(allows("http://127.0.0.1:*", "http://2130706433:80/"));
        assert!(!allows("http://127.0.0.1:*", "http://127.0.0.2:80/"));
        assert!(allows("example.com:8080", "http://example.com:8080/"));
        assert!(!allows("example.com:8080", "http://example.com/"));
        assert!(allows("[::1]:*", "http://[::1]:9/"));
        assert!(allows("*", "https://anything.example/"));
        assert!(!allows("*", "https://anything.example:444/"));
    }

    #[test]
    fn bad_patterns_are_refused() {
        for p in [
            "ftp://x.com",
            "x.com/path",
            "user@x.com",
            "*.1.2.3.4",
            "x.com:port",
            "",
            "https://",
        ] {
            assert!(AllowRule::parse(p).is_err(), "{p}");
        }
    }

    #[test]
    fn exemptions_cover_exactly_their_ranges() {
        let p = FetchPolicy::new(&FetchConfig {
            allow_addresses: vec!["127.0.0.1".into(), "10.1.0.0/16".into()],
            ..FetchConfig::default()
        })
        .unwrap();
        assert_eq!(p.blocked("127.0.0.1".parse().unwrap()), None);
        assert_eq!(p.blocked("::ffff:127.0.0.1".parse().unwrap()), None);
        assert_eq!(
            p.blocked("127.0.0.2".parse().unwrap()),
            Some(Blocked::Loopback)
        );
        assert_eq!(p.blocked("::1".parse().unwrap()), Some(Blocked::Loopback));
        assert_eq!(p.blocked("10.1.200.3".parse().unwrap()), None);
        assert_eq!(
            p.blocked("10.2.0.1".parse().unwrap()),
            Some(Blocked::Private)
        );
        let e = FetchPolicy::new(&FetchConfig {
            allow_addresses: vec!["localhost".into()],
            ..FetchConfig::default()
        })
        .unwrap_err();
        assert_eq!(e.key, "web.fetch.allow_addresses[0]");
    }
}
