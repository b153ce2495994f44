//! Tenants: who a caller is, once authenticated, and what it may do. Resolved once per
//! request by the front door's layer ([`super::Auth::authenticate`]) and carried in the
//! executor's [`crate::exec::CallRequest`]; every later step reads it from there.

use std::collections::HashSet;
use std::num::NonZeroU32;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::OwnedSemaphorePermit;

use super::config::TenantConfig;
use crate::config::{ApprovalMode, Config};
use crate::inflight::Slots;

/// The tenant of a gateway without authentication (loopback, or `--insecure-no-auth`):
/// every caller, with every capability and the server's limits.
pub const ANONYMOUS: &str = "";

/// One tenant: its permissions and its own limiters (other tenants never wait on them).
pub struct Tenant {
    /// The name (`""` for [`ANONYMOUS`]).
    pub name: String,
    tools: Option<HashSet<String>>,
    capabilities: Option<HashSet<String>>,
    /// Approval mode of its sessions created without one.
    pub approval_mode: Option<ApprovalMode>,
    /// Sessions it may have open.
    pub max_sessions: Option<usize>,
    /// Workspace size of its sessions, MiB.
    pub workspace_size_mb: Option<u64>,
    rate: Option<(DefaultDirectRateLimiter, u32)>,
    runs: Option<Bound>,
    open_rpcs: Option<Bound>,
    open_http: Option<Bound>,
}

/// One of a tenant's bounds on things held at once, and where its size comes from.
struct Bound {
    slots: Slots,
    /// `Some(percent)`: the tenant's default share of the server's bound
    /// (`auth.tenant_share_percent`); `None`: its own `limits.*`.
    share: Option<u8>,
}

impl Bound {
    /// The tenant's `explicit` limit; without one, `percent` of the server's bound
    /// `server` (at least 1); none at all with neither, or a share of 100%.
    fn new(explicit: Option<u32>, server: Option<usize>, percent: u8) -> Option<Bound> {
        let (limit, share) = match (explicit, server) {
            (Some(n), server) => (server.map_or(n as usize, |s| (n as usize).min(s)), None),
            (None, Some(server)) if percent < 100 => {
                ((server * percent as usize / 100).max(1), Some(percent))
            }
            (None, _) => return None,
        };
        Some(Bound {
            slots: Slots::new(limit),
            share,
        })
    }

    fn limit(&self) -> usize {
        self.slots.limit()
    }
}

/// How a refusal names a bound: ` (the default share, auth.tenant_share_percent 50% of
/// --max-open-rpcs)` or nothing for the tenant's own limit.
fn share_note(share: &Option<u8>, server: &str) -> String {
    match share {
        Some(p) => format!(" (its default share: auth.tenant_share_percent {p}% of {server})"),
        None => String::new(),
    }
}

/// A front door, for the tenant's share of its bound on requests open at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontDoor {
    /// The gRPC listener (`limits.open_rpcs`).
    Grpc,
    /// The HTTP listener: MCP and the provider endpoint (`limits.open_http_requests`).
    Http,
}

impl FrontDoor {
    fn requests(self) -> &'static str {
        match self {
            FrontDoor::Grpc => "gRPC requests open (calls in flight and streams held open)",
            FrontDoor::Http => "HTTP requests open",
        }
    }

    fn key(self) -> &'static str {
        match self {
            FrontDoor::Grpc => "open_rpcs",
            FrontDoor::Http => "open_http_requests",
        }
    }

    fn flag(self) -> &'static str {
        match self {
            FrontDoor::Grpc => "--max-open-rpcs",
            FrontDoor::Http => "--max-open-http-requests",
        }
    }
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Why a tenant may not start a call now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// Over `calls_per_minute` (with its burst).
    #[error(
        "tenant {tenant:?} is over its limit of {per_minute} calls per minute; retry in {} ms",
        retry_after.as_millis()
    )]
    Rate {
        /// The tenant.
        tenant: String,
        /// Its limit.
        per_minute: u32,
        /// When one more call would be allowed.
        retry_after: Duration,
    },
    /// `runs_in_flight` sandboxed runs already running.
    #[error(
        "tenant {tenant:?} already has {limit} sandboxed runs in flight (its \
         limits.runs_in_flight{}); retry when one finishes",
        share_note(share, "sandbox.max_concurrent_runs")
    )]
    Runs {
        /// The tenant.
        tenant: String,
        /// Its limit.
        limit: u32,
        /// `Some(percent)`: the limit is the tenant's default share of the server's.
        share: Option<u8>,
    },
    /// `open_rpcs` or `open_http_requests` requests already open on that front door.
    #[error(
        "tenant {tenant:?} already has its limits.{} of {limit} {}{}; retry when one ends",
        door.key(),
        door.requests(),
        share_note(share, door.flag())
    )]
    OpenRequests {
        /// The tenant.
        tenant: String,
        /// The front door.
        door: FrontDoor,
        /// Its limit there.
        limit: usize,
        /// `Some(percent)`: the limit is the tenant's default share of the server's.
        share: Option<u8>,
    },
}

impl LimitError {
    /// When to retry.
    pub fn retry_after(&self) -> Duration {
        match self {
            LimitError::Rate { retry_after, .. } => *retry_after,
            // A run takes about a second; there is no better estimate.
            LimitError::Runs { .. } => Duration::from_secs(1),
            LimitError::OpenRequests { .. } => crate::inflight::RETRY_AFTER,
        }
    }
}

impl Tenant {
    /// The tenant of an unauthenticated gateway (one shared value).
    pub fn anonymous() -> Arc<Tenant> {
        static ANONYMOUS_TENANT: LazyLock<Arc<Tenant>> = LazyLock::new(|| {
            Arc::new(Tenant {
                name: ANONYMOUS.to_string(),
                tools: None,
                capabilities: None,
                approval_mode: None,
                max_sessions: None,
                workspace_size_mb: None,
                rate: None,
                runs: None,
                open_rpcs: None,
                open_http: None,
            })
        });
        ANONYMOUS_TENANT.clone()
    }

    /// What a request that bypassed authentication gets: no tools, no capabilities, and a
    /// name no session or approval carries.
    pub fn nobody() -> Arc<Tenant> {
        Arc::new(Tenant {
            name: "\0nobody".to_string(),
            tools: Some(HashSet::new()),
            capabilities: Some(HashSet::new()),
            approval_mode: None,
            max_sessions: Some(0),
            workspace_size_mb: None,
            rate: None,
            runs: None,
            open_rpcs: None,
            open_http: None,
        })
    }

    /// A tenant with `config`'s settings (already validated against the server's). A
    /// bound of the server's the tenant sets no limit of its own for (open gRPC and HTTP
    /// requests, sandboxed runs, sessions) is capped at its default share
    /// (`auth.tenant_share_percent` of it), so that no one tenant can hold all of it.
    pub fn new(name: &str, config: &TenantConfig, server: &Config) -> Arc<Tenant> {
        let l = &config.limits;
        let rate = l
            .calls_per_minute
            .and_then(NonZeroU32::new)
            .map(|per_minute| {
                let burst = l.burst.and_then(NonZeroU32::new).unwrap_or(per_minute);
                (
                    RateLimiter::direct(Quota::per_minute(per_minute).allow_burst(burst)),
                    per_minute.get(),
                )
            });
        let percent = server.auth.tenant_share_percent;
        let doors = &server.auth.front_doors;
        Arc::new(Tenant {
            name: name.to_string(),
            tools: config.tools.as_ref().map(|t| t.iter().cloned().collect()),
            capabilities: config
                .capabilities
                .as_ref()
                .filter(|c| !c.iter().any(|c| c == "*"))
                .map(|c| c.iter().cloned().collect()),
            approval_mode: config.approval_mode,
            max_sessions: Bound::new(l.sessions, Some(server.sessions.max_sessions), percent)
                .map(|b| b.limit()),
            workspace_size_mb: l.workspace_size_mb,
            rate,
            runs: Bound::new(
                l.runs_in_flight,
                server.sandbox.max_concurrent_runs,
                percent,
            ),
            // An explicit share is at most the server's own bound (checked at startup:
            // `AuthConfig::apply_front_door_bounds`).
            open_rpcs: Bound::new(l.open_rpcs, Some(doors.open_rpcs), percent),
            open_http: Bound::new(
                l.open_http_requests,
                Some(doors.open_http_requests),
                percent,
            ),
        })
    }

    /// The name as logs and labels show it (`anonymous` for the unauthenticated tenant).
    pub fn display_name(&self) -> &str {
        if self.name.is_empty() {
            "anonymous"
        } else {
            &self.name
        }
    }

    /// The tenant may list and call the tool `id`.
    pub fn may_use(&self, id: &str) -> bool {
        self.tools.as_ref().is_none_or(|t| t.contains(id))
    }

    /// The first of `required` the tenant does not hold.
    pub fn missing_capability<'a>(&self, required: &[&'a str]) -> Option<&'a str> {
        let held = self.capabilities.as_ref()?;
        required.iter().copied().find(|c| !held.contains(*c))
    }

    /// Takes one call from the tenant's rate (calls per minute with burst).
    pub fn admit_call(&self) -> Result<(), LimitError> {
        let Some((limiter, per_minute)) = &self.rate else {
            return Ok(());
        };
        limiter.check().map_err(|not_until| LimitError::Rate {
            tenant: self.display_name().to_string(),
            per_minute: *per_minute,
            retry_after: not_until
                .wait_time_from(DefaultClock::default().now())
                .max(Duration::from_millis(1)),
        })
    }

    /// A slot for one sandboxed run, held until the permit drops. Over the tenant's own
    /// `limits.runs_in_flight` a run is refused at once; at its default share of
    /// `sandbox.max_concurrent_runs` it waits for a slot of the tenant's, as runs wait for
    /// the server's (the caller bounds the wait by the call's timeout): a tenant's flood
    /// then queues behind its own share rather than in front of other tenants' runs.
    pub async fn begin_run(&self) -> Result<Option<OwnedSemaphorePermit>, LimitError> {
        let Some(bound) = &self.runs else {
            return Ok(None);
        };
        if bound.share.is_some() {
            return Ok(Some(bound.slots.take().await));
        }
        bound
            .slots
            .try_take()
            .map(Some)
            .ok_or_else(|| LimitError::Runs {
                tenant: self.display_name().to_string(),
                limit: bound.limit() as u32,
                share: bound.share,
            })
    }
}

impl Tenant {
    /// A slot among the tenant's requests open on `door`, held until the permit drops
    /// (the front door's layer puts it in the response body).
    pub fn open_request(
        &self,
        door: FrontDoor,
    ) -> Result<Option<OwnedSemaphorePermit>, LimitError> {
        let bound = match door {
            FrontDoor::Grpc => &self.open_rpcs,
            FrontDoor::Http => &self.open_http,
        };
        let Some(bound) = bound else {
            return Ok(None);
        };
        bound
            .slots
            .try_take()
            .map(Some)
            .ok_or_else(|| LimitError::OpenRequests {
                tenant: self.display_name().to_string(),
                door,
                limit: bound.limit(),
                share: bound.share,
            })
    }

    /// The tenant's bound on requests open on `door` (`None`: only the server's).
    pub fn open_requests_limit(&self, door: FrontDoor) -> Option<usize> {
        match door {
            FrontDoor::Grpc => &self.open_rpcs,
            FrontDoor::Http => &self.open_http,
        }
        .as_ref()
        .map(Bound::limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::config::TenantLimits;

    #[tokio::test]
    async fn limits_capabilities_and_tools() {
        let cfg = TenantConfig {
            tools: Some(vec!["calculator".into()]),
            capabilities: Some(vec!["execute".into()]),
            limits: TenantLimits {
                calls_per_minute: Some(60),
                burst: Some(2),
                runs_in_flight: Some(1),
                ..TenantLimits::default()
            },
            ..TenantConfig::default()
        };
        let t = Tenant::new("a", &cfg, &Config::default());
        assert!(t.may_use("calculator") && !t.may_use("echo"));
        assert_eq!(t.missing_capability(&["execute"]), None);
        assert_eq!(
            t.missing_capability(&["execute", "network"]),
            Some("network")
        );
        t.admit_call().unwrap();
        t.admit_call().unwrap();
        let e = t.admit_call().unwrap_err();
        assert!(e.retry_after() > Duration::from_millis(500), "{e:?}");
        assert!(e.retry_after() <= Duration::from_secs(1), "{e:?}");
        let held = t.begin_run().await.unwrap();
        assert!(matches!(
            t.begin_run().await,
            Err(LimitError::Runs { limit: 1, .. })
        ));
        drop(held);
        assert!(t.begin_run().await.unwrap().is_some());
        // No share of the front doors' bounds configured: the default share of the
        // server's bound.
        assert_eq!(
            t.open_requests_limit(FrontDoor::Grpc),
            Some(crate::inflight::DEFAULT_MAX_OPEN_RPCS / 2)
        );
        assert!(t.open_request(FrontDoor::Grpc).unwrap().is_some());
        let anon = Tenant::anonymous();
        assert!(anon.may_use("anything") && anon.missing_capability(&["network"]).is_none());
        for _ in 0..1000 {
            anon.admit_call().unwrap();
        }
    }

    #[test]
    fn open_requests_are_counted_per_tenant_and_door() {
        let cfg = TenantConfig {
            limits: TenantLimits {
                open_rpcs: Some(2),
                open_http_requests: Some(1),
                ..TenantLimits::default()
            },
            ..TenantConfig::default()
        };
        let (a, b) = (
            Tenant::new("a", &cfg, &Config::default()),
            Tenant::new("b", &cfg, &Config::default()),
        );
        let held: Vec<_> = (0..2)
            .map(|_| a.open_request(FrontDoor::Grpc).unwrap().unwrap())
            .collect();
        let e = a.open_request(FrontDoor::Grpc).unwrap_err();
        assert_eq!(
            e,
            LimitError::OpenRequests {
                tenant: "a".into(),
                door: FrontDoor::Grpc,
                limit: 2,
                share: None,
            }
        );
        assert!(e.to_string().contains("limits.open_rpcs"), "{e}");
        assert_eq!(e.retry_after(), Duration::from_secs(1));
        // Control: the other door's share and the other tenant's are their own.
        let h = a.open_request(FrontDoor::Http).unwrap().unwrap();
        assert!(
            a.open_request(FrontDoor::Http)
                .unwrap_err()
                .to_string()
                .contains("limits.open_http_requests")
        );
        assert!(b.open_request(FrontDoor::Grpc).unwrap().is_some());
        drop((held, h));
        assert!(a.open_request(FrontDoor::Grpc).unwrap().is_some());
        assert!(a.open_request(FrontDoor::Http).unwrap().is_some());
    }

    #[tokio::test]
    async fn a_tenant_without_limits_gets_its_default_share_of_each_server_bound() {
        let mut server = Config::from_yaml(
            "sandbox: {max_concurrent_runs: 10}\nsessions: {max_sessions: 9}\n\
             auth: {tenant_share_percent: 30}\n",
        )
        .unwrap();
        server.auth.apply_front_door_bounds(20, 3).unwrap();
        let t = Tenant::new("a", &TenantConfig::default(), &server);
        assert_eq!(t.open_requests_limit(FrontDoor::Grpc), Some(6));
        // 30% of 3 rounds down to 0: at least one.
        assert_eq!(t.open_requests_limit(FrontDoor::Http), Some(1));
        assert_eq!(t.max_sessions, Some(2));
        // Runs at the share wait for a slot of the tenant's (as for the server's), rather
        // than being refused; the wait ends when one of its runs does.
        let mut runs = Vec::new();
        for _ in 0..3 {
            runs.push(t.begin_run().await.unwrap().unwrap());
        }
        let wait = tokio::time::timeout(Duration::from_millis(50), t.begin_run()).await;
        assert!(wait.is_err(), "a fourth run waits");
        let t2 = t.clone();
        let waiting = tokio::spawn(async move { t2.begin_run().await.map(|p| p.is_some()) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        drop(runs.pop());
        let got = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("a freed slot ends the wait")
            .unwrap();
        assert_eq!(got, Ok(true));
        let e = LimitError::Runs {
            tenant: "a".into(),
            limit: 3,
            share: Some(30),
        };
        assert!(
            e.to_string().contains(
                "default share: auth.tenant_share_percent 30% of sandbox.max_concurrent_runs"
            ),
            "{e}"
        );
        drop(runs);
        let held = t.open_request(FrontDoor::Http).unwrap().unwrap();
        let e = t.open_request(FrontDoor::Http).unwrap_err().to_string();
        assert!(
            e.contains("limits.open_http_requests of 1")
                && e.contains("30% of --max-open-http-requests"),
            "{e}"
        );
        drop(held);
        // An explicit limit wins over the share, in either direction.
        let own = TenantConfig {
            limits: TenantLimits {
                open_rpcs: Some(20),
                runs_in_flight: Some(1),
                sessions: Some(9),
                ..TenantLimits::default()
            },
            ..TenantConfig::default()
        };
        let t = Tenant::new("b", &own, &server);
        assert_eq!(t.open_requests_limit(FrontDoor::Grpc), Some(20));
        assert_eq!(t.max_sessions, Some(9));
        let _run = t.begin_run().await.unwrap().unwrap();
        assert_eq!(
            t.begin_run().await.unwrap_err(),
            LimitError::Runs {
                tenant: "b".into(),
                limit: 1,
                share: None
            }
        );
        // A share of 100%: no bound of the tenant's own; and no share of a bound the
        // server does not set (sandbox.max_concurrent_runs unset).
        server.auth.tenant_share_percent = 100;
        let t = Tenant::new("c", &TenantConfig::default(), &server);
        assert_eq!(t.open_requests_limit(FrontDoor::Grpc), None);
        assert_eq!(t.max_sessions, None);
        server.auth.tenant_share_percent = 50;
        server.sandbox.max_concurrent_runs = None;
        let t = Tenant::new("d", &TenantConfig::default(), &server);
        assert!(t.begin_run().await.unwrap().is_none());
        // The anonymous tenant (no authentication) has no shares at all.
        let anon = Tenant::anonymous();
        assert_eq!(anon.open_requests_limit(FrontDoor::Grpc), None);
        assert!(anon.max_sessions.is_none());
    }
}
