//! The `auth:` section of the configuration file: where the API keys are, and what each
//! tenant may do.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use toolrun_crd::labels::is_dns_label;

use super::mtls::CertName;
use crate::config::{ApprovalMode, ConfigError, SessionsConfig};

/// `auth:`. Authentication is on when a keys file is named here or by `--api-keys`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// The API keys file (YAML, only hashes: see `toolrun keys create`); `--api-keys`
    /// overrides it. Unset: no authentication (allowed on loopback addresses only).
    pub keys_file: Option<PathBuf>,
    /// How often the keys file is read again, seconds (1..=3600; default 2): a new or
    /// revoked key takes effect within this long, without a restart.
    pub reload_interval_seconds: u64,
    /// Tenants by name (the name a key maps to).
    pub tenants: BTreeMap<String, TenantConfig>,
    /// Settings of a tenant that a key names but `tenants` does not list.
    pub default_tenant: TenantConfig,
    /// Each tenant's default share, in percent (1..=100; default 50), of every server-wide
    /// bound it sets no limit of its own for: `--max-open-rpcs` (`limits.open_rpcs`),
    /// `--max-open-http-requests` (`limits.open_http_requests`),
    /// `sandbox.max_concurrent_runs` when set (`limits.runs_in_flight`) and
    /// `sessions.max_sessions` (`limits.sessions`). Below 100 no one tenant can hold a
    /// whole bound and starve the others; 100 lets any tenant take all of it. Without
    /// authentication (the anonymous tenant) there are no shares.
    pub tenant_share_percent: u8,
    /// The front doors' bounds, which are server flags rather than keys of the file (set
    /// by [`AuthConfig::apply_front_door_bounds`]; their defaults otherwise).
    #[serde(skip)]
    pub front_doors: FrontDoorBounds,
}

/// The default of `auth.tenant_share_percent`.
pub const DEFAULT_TENANT_SHARE_PERCENT: u8 = 50;

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            keys_file: None,
            reload_interval_seconds: 2,
            tenants: BTreeMap::new(),
            default_tenant: TenantConfig::default(),
            tenant_share_percent: DEFAULT_TENANT_SHARE_PERCENT,
            front_doors: FrontDoorBounds::default(),
        }
    }
}

/// The server's bounds on requests open at once, per front door.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrontDoorBounds {
    /// `--max-open-rpcs`.
    pub open_rpcs: usize,
    /// `--max-open-http-requests`.
    pub open_http_requests: usize,
}

impl Default for FrontDoorBounds {
    fn default() -> Self {
        FrontDoorBounds {
            open_rpcs: crate::inflight::DEFAULT_MAX_OPEN_RPCS,
            open_http_requests: crate::inflight::DEFAULT_MAX_OPEN_HTTP_REQUESTS,
        }
    }
}

/// What one tenant may do.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TenantConfig {
    /// Tools (ids) the tenant may list and call; unset: every enabled tool.
    pub tools: Option<Vec<String>>,
    /// Capabilities the tenant holds (`execute`, `filesystem.read`, `filesystem.write`,
    /// `network`, ...); a tool requiring one the tenant lacks is refused. Unset: all.
    pub capabilities: Option<Vec<String>>,
    /// Approval mode of the tenant's sessions created without one (default: the server's
    /// `sessions.default_approval_mode`).
    pub approval_mode: Option<ApprovalMode>,
    /// Limits; each at most the server's.
    pub limits: TenantLimits,
    /// Client certificates that authenticate as this tenant (mutual TLS, `tls.client_ca_file`):
    /// `CN=<common name>`, `DNS:<name>`, `URI:<uri>` or a bare URI such as a SPIFFE ID
    /// (`spiffe://trust-domain/ns/x/sa/y`). A name belongs to one tenant at most.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub client_certs: Vec<String>,
}

/// `tls:`: TLS on the gRPC and HTTP (MCP, provider) listeners, and client certificates.
/// The admin port stays plain HTTP (probes and metrics).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// The server's certificate chain, PEM (`--tls-cert`). With `key_file`: both listeners
    /// speak TLS only.
    pub cert_file: Option<PathBuf>,
    /// Its private key, PEM: PKCS#8, PKCS#1 or SEC1 (`--tls-key`).
    pub key_file: Option<PathBuf>,
    /// CA certificates (PEM) that client certificates must chain to (`--tls-client-ca`):
    /// mutual TLS, the tenant taken from the certificate (`auth.tenants.*.client_certs`).
    pub client_ca_file: Option<PathBuf>,
    /// With `client_ca_file`: `required` (a connection without a valid client certificate
    /// fails its handshake) or `optional` (callers without one send an API key).
    pub client_auth: ClientAuth,
    /// How often the files are read again, seconds (1..=3600): a rotated certificate, key or
    /// CA (cert-manager renewing a Secret) serves new connections within this long.
    pub reload_interval_seconds: u64,
    /// A TLS handshake not finished within this long is dropped, ms (100..=60000).
    pub handshake_timeout_ms: u64,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            client_auth: ClientAuth::Required,
            reload_interval_seconds: 10,
            handshake_timeout_ms: 10_000,
        }
    }
}

/// Whether client certificates are required (`tls.client_auth`, `--tls-client-auth`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    /// Every connection presents a certificate that chains to the client CA.
    #[default]
    Required,
    /// A certificate, when presented, must chain to the client CA; callers without one
    /// authenticate with an API key.
    Optional,
}

impl TlsConfig {
    /// TLS is on (a certificate and key are given).
    pub fn enabled(&self) -> bool {
        self.cert_file.is_some()
    }

    /// Client certificates are verified (mutual TLS).
    pub fn mutual(&self) -> bool {
        self.enabled() && self.client_ca_file.is_some()
    }

    /// Checks that the files come together and the ranges.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: &str| ConfigError::Invalid {
            key: format!("tls.{key}"),
            message: message.into(),
        };
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => {
                return Err(invalid(
                    "key_file",
                    "is required with tls.cert_file (--tls-key)",
                ));
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "cert_file",
                    "is required with tls.key_file (--tls-cert)",
                ));
            }
            _ => {}
        }
        if self.client_ca_file.is_some() && self.cert_file.is_none() {
            return Err(invalid(
                "client_ca_file",
                "client certificates need TLS: give tls.cert_file and tls.key_file \
                 (--tls-cert, --tls-key)",
            ));
        }
        if !(1..=3600).contains(&self.reload_interval_seconds) {
            return Err(invalid(
                "reload_interval_seconds",
                &format!("{} is out of range 1..=3600", self.reload_interval_seconds),
            ));
        }
        if !(100..=60_000).contains(&self.handshake_timeout_ms) {
            return Err(invalid(
                "handshake_timeout_ms",
                &format!("{} is out of range 100..=60000", self.handshake_timeout_ms),
            ));
        }
        Ok(())
    }
}

/// A tenant's limits (unset: its default share of the server's bound,
/// `auth.tenant_share_percent`, or none where the server has no bound).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TenantLimits {
    /// Sandboxed runs (run_code, shell) running at once; one more is refused with
    /// RESOURCE_EXHAUSTED (at most `sandbox.max_concurrent_runs` when that is set). Unset,
    /// with `sandbox.max_concurrent_runs` set: the tenant's default share of it, where one
    /// more run waits (within its timeout) instead of being refused.
    pub runs_in_flight: Option<u32>,
    /// Sessions open at once (at most `sessions.max_sessions`).
    pub sessions: Option<u32>,
    /// Tool calls per minute, refilled evenly (1..=1,000,000).
    pub calls_per_minute: Option<u32>,
    /// Calls that may come at once above the steady rate (default: `calls_per_minute`,
    /// i.e. a minute's worth).
    pub burst: Option<u32>,
    /// Size of each of the tenant's session workspaces, MiB (at most
    /// `sessions.workspace_size_mb`).
    pub workspace_size_mb: Option<u64>,
    /// gRPC requests open at once (calls in flight and streams held open, over all the
    /// tenant's connections and keys); one more is refused with RESOURCE_EXHAUSTED (at most
    /// the server's `--max-open-rpcs`). Keeps one tenant from taking every slot.
    pub open_rpcs: Option<u32>,
    /// HTTP requests (MCP, provider endpoint) open at once; one more is `429` (at most the
    /// server's `--max-open-http-requests`).
    pub open_http_requests: Option<u32>,
}

/// A capability name: lowercase letters, digits, `_` and `-`, in dot-separated parts.
pub fn valid_capability(c: &str) -> bool {
    c == "*"
        || (!c.is_empty()
            && c.len() <= 64
            && c.split('.').all(|p| {
                !p.is_empty()
                    && p.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'
                    })
            }))
}

/// A tenant name: a DNS label (it becomes a Kubernetes label value on ToolRuns).
pub fn valid_tenant_name(name: &str) -> bool {
    is_dns_label(name)
}

impl AuthConfig {
    /// Checks names and ranges, and that no tenant limit exceeds the server's.
    pub fn validate(
        &self,
        sessions: &SessionsConfig,
        max_concurrent_runs: Option<usize>,
    ) -> Result<(), ConfigError> {
        if !(1..=3600).contains(&self.reload_interval_seconds) {
            return Err(ConfigError::Invalid {
                key: "auth.reload_interval_seconds".into(),
                message: format!("{} is out of range 1..=3600", self.reload_interval_seconds),
            });
        }
        if !(1..=100).contains(&self.tenant_share_percent) {
            return Err(ConfigError::Invalid {
                key: "auth.tenant_share_percent".into(),
                message: format!("{} is out of range 1..=100", self.tenant_share_percent),
            });
        }
        self.default_tenant
            .validate("auth.default_tenant", sessions, max_concurrent_runs)?;
        for (name, t) in &self.tenants {
            let key = format!("auth.tenants.{name}");
            if !valid_tenant_name(name) {
                return Err(ConfigError::Invalid {
                    key,
                    message: "a tenant name is 1-63 lowercase letters, digits and '-', \
                              starting and ending with a letter or digit"
                        .into(),
                });
            }
            t.validate(&key, sessions, max_concurrent_runs)?;
        }
        let mut owners: BTreeMap<CertName, &str> = BTreeMap::new();
        for (name, t) in &self.tenants {
            for (i, entry) in t.client_certs.iter().enumerate() {
                let key = format!("auth.tenants.{name}.client_certs[{i}]");
                let parsed = CertName::parse(entry).map_err(|message| ConfigError::Invalid {
                    key: key.clone(),
                    message,
                })?;
                if let Some(other) = owners.insert(parsed.clone(), name) {
                    return Err(ConfigError::Invalid {
                        key,
                        message: format!(
                            "{parsed} is already a client certificate of tenant {other:?}: a \
                             certificate name maps to one tenant"
                        ),
                    });
                }
            }
        }
        if !self.default_tenant.client_certs.is_empty() {
            return Err(ConfigError::Invalid {
                key: "auth.default_tenant.client_certs".into(),
                message:
                    "map client certificates to a named tenant (auth.tenants.NAME.client_certs)"
                        .into(),
            });
        }
        Ok(())
    }
}

impl AuthConfig {
    /// Takes the front doors' bounds, which are server flags (`--max-open-rpcs`,
    /// `--max-open-http-requests`) rather than keys of the file: the tenants' default
    /// shares are taken of them, and each explicit share is checked against them.
    pub fn apply_front_door_bounds(
        &mut self,
        max_open_rpcs: usize,
        max_open_http_requests: usize,
    ) -> Result<(), ConfigError> {
        self.front_doors = FrontDoorBounds {
            open_rpcs: max_open_rpcs,
            open_http_requests: max_open_http_requests,
        };
        self.validate_open_requests(max_open_rpcs, max_open_http_requests)
    }

    /// Checks the tenants' explicit shares of the front doors' bounds.
    fn validate_open_requests(
        &self,
        max_open_rpcs: usize,
        max_open_http_requests: usize,
    ) -> Result<(), ConfigError> {
        let tenants = std::iter::once(("auth.default_tenant".to_string(), &self.default_tenant))
            .chain(
                self.tenants
                    .iter()
                    .map(|(name, t)| (format!("auth.tenants.{name}"), t)),
            );
        for (key, t) in tenants {
            for (name, value, server, flag) in [
                (
                    "open_rpcs",
                    t.limits.open_rpcs,
                    max_open_rpcs,
                    "--max-open-rpcs",
                ),
                (
                    "open_http_requests",
                    t.limits.open_http_requests,
                    max_open_http_requests,
                    "--max-open-http-requests",
                ),
            ] {
                let Some(v) = value else { continue };
                let message = if v == 0 {
                    "0 is out of range 1.. (unset it for the default share, \
                     auth.tenant_share_percent)"
                        .to_string()
                } else if v as usize > server {
                    format!("{v} exceeds the server's {flag} ({server})")
                } else {
                    continue;
                };
                return Err(ConfigError::Invalid {
                    key: format!("{key}.limits.{name}"),
                    message,
                });
            }
        }
        Ok(())
    }
}

impl TenantConfig {
    fn validate(
        &self,
        key: &str,
        sessions: &SessionsConfig,
        max_concurrent_runs: Option<usize>,
    ) -> Result<(), ConfigError> {
        let invalid = |field: &str, message: String| ConfigError::Invalid {
            key: format!("{key}.{field}"),
            message,
        };
        for (i, c) in self.capabilities.iter().flatten().enumerate() {
            if !valid_capability(c) {
                return Err(invalid(
                    &format!("capabilities[{i}]"),
                    format!("{c:?} is not a capability name (e.g. execute, filesystem.write)"),
                ));
            }
        }
        let l = &self.limits;
        let server_runs = max_concurrent_runs.map_or(u64::from(u32::MAX), |n| n as u64);
        let checks: [(&str, Option<u64>, u64, u64, &str); 5] = [
            (
                "runs_in_flight",
                l.runs_in_flight.map(u64::from),
                1,
                server_runs,
                "sandbox.max_concurrent_runs",
            ),
            (
                "sessions",
                l.sessions.map(u64::from),
                1,
                sessions.max_sessions as u64,
                "sessions.max_sessions",
            ),
            (
                "calls_per_minute",
                l.calls_per_minute.map(u64::from),
                1,
                1_000_000,
                "",
            ),
            ("burst", l.burst.map(u64::from), 1, 1_000_000, ""),
            (
                "workspace_size_mb",
                l.workspace_size_mb,
                16,
                sessions.workspace_size_mb,
                "sessions.workspace_size_mb",
            ),
        ];
        for (name, value, lo, hi, server_key) in checks {
            if let Some(v) = value
                && !(lo..=hi).contains(&v)
            {
                let why = if server_key.is_empty() || v < lo {
                    format!("{v} is out of range {lo}..={hi}")
                } else {
                    format!("{v} exceeds the server's {server_key} ({hi})")
                };
                return Err(invalid(&format!("limits.{name}"), why));
            }
        }
        if l.burst.is_some() && l.calls_per_minute.is_none() {
            return Err(invalid(
                "limits.burst",
                "goes with limits.calls_per_minute".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn tenant_limits_are_capped_by_the_servers() {
        let c = Config::from_yaml(
            "auth:\n  keys_file: /k.yaml\n  tenants:\n    team-a:\n      tools: [calculator]\n      \
             capabilities: [execute]\n      approval_mode: none\n      limits: {runs_in_flight: 2, \
             sessions: 3, calls_per_minute: 60, burst: 5, workspace_size_mb: 64}\n",
        )
        .unwrap();
        assert_eq!(c.auth.tenants["team-a"].limits.burst, Some(5));
        for (yaml, key) in [
            ("tenants: {Bad_Name: {}}", "auth.tenants.Bad_Name"),
            (
                "tenants: {a: {limits: {sessions: 100000}}}",
                "auth.tenants.a.limits.sessions",
            ),
            (
                "tenants: {a: {limits: {workspace_size_mb: 4096}}}",
                "auth.tenants.a.limits.workspace_size_mb",
            ),
            (
                "tenants: {a: {capabilities: ['Exec ute']}}",
                "auth.tenants.a.capabilities[0]",
            ),
            (
                "default_tenant: {limits: {burst: 3}}",
                "auth.default_tenant.limits.burst",
            ),
            ("reload_interval_seconds: 0", "auth.reload_interval_seconds"),
            ("tenant_share_percent: 0", "auth.tenant_share_percent"),
            ("tenant_share_percent: 101", "auth.tenant_share_percent"),
            ("tenants: {a: {limitz: {}}}", "auth.tenants.a"),
            (
                "tenants: {a: {client_certs: [agent-a]}}",
                "auth.tenants.a.client_certs[0]",
            ),
            (
                "tenants: {a: {client_certs: [CN=x]}, b: {client_certs: ['cn=x']}}",
                "auth.tenants.b.client_certs[0]",
            ),
            (
                "default_tenant: {client_certs: [CN=x]}",
                "auth.default_tenant.client_certs",
            ),
        ] {
            let e = Config::from_yaml(&format!("auth:\n  {yaml}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{yaml}: {e}");
        }
        let e = Config::from_yaml(
            "sandbox: {max_concurrent_runs: 4}\nauth:\n  tenants: {a: {limits: {runs_in_flight: 5}}}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("exceeds the server's sandbox.max_concurrent_runs"),
            "{e}"
        );
    }

    #[test]
    fn open_request_shares_are_capped_by_the_server_flags() {
        let c = Config::from_yaml(
            "auth:\n  tenants: {a: {limits: {open_rpcs: 64, open_http_requests: 8}}}\n  \
             default_tenant: {limits: {open_rpcs: 16}}\n",
        )
        .unwrap();
        assert_eq!(c.auth.tenants["a"].limits.open_rpcs, Some(64));
        c.auth.validate_open_requests(64, 8).unwrap();
        for (rpcs, http, key, why) in [
            (
                63,
                8,
                "auth.tenants.a.limits.open_rpcs",
                "--max-open-rpcs (63)",
            ),
            (
                64,
                7,
                "auth.tenants.a.limits.open_http_requests",
                "--max-open-http-requests (7)",
            ),
            (15, 8, "auth.default_tenant.limits.open_rpcs", "(15)"),
        ] {
            let e = c
                .auth
                .validate_open_requests(rpcs, http)
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains(why), "{e}");
        }
        let zero = Config::from_yaml("auth:\n  tenants: {a: {limits: {open_rpcs: 0}}}\n").unwrap();
        let e = zero
            .auth
            .validate_open_requests(10, 10)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("auth.tenants.a.limits.open_rpcs: 0 is out of range"),
            "{e}"
        );
    }

    #[test]
    fn tls_files_come_together() {
        let c = Config::from_yaml(
            "tls: {cert_file: /c.pem, key_file: /k.pem, client_ca_file: /ca.pem, client_auth: optional}\n",
        )
        .unwrap();
        assert!(c.tls.enabled() && c.tls.mutual());
        assert_eq!(c.tls.client_auth, super::ClientAuth::Optional);
        assert!(!Config::default().tls.enabled());
        for (yaml, key) in [
            ("{cert_file: /c.pem}", "tls.key_file"),
            ("{key_file: /k.pem}", "tls.cert_file"),
            ("{client_ca_file: /ca.pem}", "tls.client_ca_file"),
            (
                "{cert_file: /c, key_file: /k, reload_interval_seconds: 0}",
                "tls.reload_interval_seconds",
            ),
            (
                "{cert_file: /c, key_file: /k, handshake_timeout_ms: 5}",
                "tls.handshake_timeout_ms",
            ),
            ("{client_auth: sometimes}", "tls.client_auth"),
        ] {
            let e = Config::from_yaml(&format!("tls: {yaml}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{yaml}: {e}");
        }
    }
}
