//! Tenants: who a caller is, once authenticated, and what it may do. Resolved once per
//! request by the front door's layer ([`super::Auth::authenticate`]) and carried in the
//! executor's [`crate::exec::CallRequest`]; every later step reads it from there.

use std::collections::HashSet;
use std::num::NonZeroU32;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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
    runs: Option<(Arc<Semaphore>, u32)>,
    open_rpcs: Option<Slots>,
    open_http: Option<Slots>,
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
        "tenant {tenant:?} already has {limit} sandboxed runs in flight (its runs_in_flight); \
         retry when one finishes"
    )]
    Runs {
        /// The tenant.
        tenant: String,
        /// Its limit.
        limit: u32,
    },
    /// `open_rpcs` or `open_http_requests` requests already open on that front door.
    #[error(
        "tenant {tenant:?} already has its limits.{} of {limit} {}; retry when one ends",
        door.key(),
        door.requests()
    )]
    OpenRequests {
        /// The tenant.
        tenant: String,
        /// The front door.
        door: FrontDoor,
        /// Its limit there.
        limit: usize,
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

    /// A tenant with `config`'s settings (already validated against the server's).
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
        let runs_cap = match (l.runs_in_flight, server.sandbox.max_concurrent_runs) {
            (Some(n), Some(server)) => Some(n.min(server as u32)),
            (n, _) => n,
        };
        Arc::new(Tenant {
            name: name.to_string(),
            tools: config.tools.as_ref().map(|t| t.iter().cloned().collect()),
            capabilities: config
                .capabilities
                .as_ref()
                .filter(|c| !c.iter().any(|c| c == "*"))
                .map(|c| c.iter().cloned().collect()),
            approval_mode: config.approval_mode,
            max_sessions: l.sessions.map(|n| n as usize),
            workspace_size_mb: l.workspace_size_mb,
            rate,
            runs: runs_cap.map(|n| (Arc::new(Semaphore::new(n as usize)), n)),
            // At most the server's own bound (checked at startup: `validate_open_requests`).
            open_rpcs: l.open_rpcs.map(|n| Slots::new(n as usize)),
            open_http: l.open_http_requests.map(|n| Slots::new(n as usize)),
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

    /// A slot for one sandboxed run, held until the permit drops.
    pub fn begin_run(&self) -> Result<Option<OwnedSemaphorePermit>, LimitError> {
        let Some((sem, limit)) = &self.runs else {
            return Ok(None);
        };
        sem.clone()
            .try_acquire_owned()
            .map(Some)
            .map_err(|_| LimitError::Runs {
                tenant: self.display_name().to_string(),
                limit: *limit,
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
        let slots = match door {
            FrontDoor::Grpc => &self.open_rpcs,
            FrontDoor::Http => &self.open_http,
        };
        let Some(slots) = slots else {
            return Ok(None);
        };
        slots
            .try_take()
            .map(Some)
            .ok_or_else(|| LimitError::OpenRequests {
                tenant: self.display_name().to_string(),
                door,
                limit: slots.limit(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::config::TenantLimits;

    #[test]
    fn limits_capabilities_and_tools() {
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
        let held = t.begin_run().unwrap();
        assert!(matches!(
            t.begin_run(),
            Err(LimitError::Runs { limit: 1, .. })
        ));
        drop(held);
        assert!(t.begin_run().unwrap().is_some());
        // No share of the front doors' bounds configured: nothing to hold.
        assert!(t.open_request(FrontDoor::Grpc).unwrap().is_none());
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
                limit: 2
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
}
