//! Fail closed before the first program: the API server must be unreachable from the sandbox.
//!
//! A pod's deny-all NetworkPolicy is programmed by the policy controller after the pod
//! starts, so a program that runs in the pod's first moments could still reach the network.
//! Before the first run the runner (one-shot) or the agent tries a TCP connect to a target
//! that must be unreachable, by default the API server the kubelet names in
//! `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT`. A connect that fails (refused,
//! unreachable, timed out: the policy drops or rejects the packets) means isolated. A connect
//! that succeeds is retried every [`RETRY_INTERVAL`] until `wait` has passed (the policy may
//! still be on its way); reachable through the whole wait means the isolation is not in
//! force, and every run is refused with `INFRA_ERROR` naming the address.
//!
//! A first check alone is not enough: a policy controller that fails closed drops a pod's
//! packets until it has programmed the pod, so a pod that no policy isolates also passes a
//! check made in its first moments (a long-lived agent starts long before its first run).
//! Both modes therefore keep watching ([`ReachCheck::watch`]): one connect every `recheck`
//! interval, the agent for as long as it lives (the first connect that succeeds kills the
//! running program and latches the pod as not isolated: every later run refused), the
//! one-shot runner while its program runs (the first that succeeds kills the program and
//! everything it started; the record is `INFRA_ERROR`).

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Pause between two connects that succeeded.
pub const RETRY_INTERVAL: Duration = Duration::from_millis(100);
/// Default bound on the wait for the isolation to come into force.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(5);
/// Default timeout of one connect attempt: a reachable API server on the cluster network
/// answers a SYN in well under a millisecond; a dropping policy never answers.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// Default pause between two checks after the first (0 turns the watch off).
pub const DEFAULT_RECHECK: Duration = Duration::from_millis(1000);
/// Environment variable holding the target (`HOST:PORT`, `auto`, or `off`) when no flag does.
pub const ENV_TARGET: &str = "TOOLRUN_REQUIRE_UNREACHABLE";
/// Environment variable holding the wait in milliseconds when no flag does.
pub const ENV_WAIT_MS: &str = "TOOLRUN_UNREACHABLE_WAIT_MS";
/// Environment variable holding the re-check interval in milliseconds when no flag does.
pub const ENV_RECHECK_MS: &str = "TOOLRUN_RECHECK_INTERVAL_MS";

/// What to check, and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReachCheck {
    /// `HOST:PORT`, as shown in messages.
    pub target: String,
    /// Bound on the wait for the target to become unreachable.
    pub wait: Duration,
    /// Timeout of one connect.
    pub connect_timeout: Duration,
    /// Pause between two checks once the first has passed (zero: no watch).
    pub recheck: Duration,
}

/// Resolves a `--require-unreachable` value: `HOST:PORT` (IPv6 as `[::1]:443`), `auto`
/// (the API server from the Kubernetes service environment, none when it is unset) or
/// `off`. `env` looks up an environment variable.
pub fn target_from(value: &str, env: impl Fn(&str) -> Option<String>) -> Option<String> {
    match value {
        "off" | "" => None,
        "auto" => {
            let host = env("KUBERNETES_SERVICE_HOST").filter(|h| !h.is_empty())?;
            let port = env("KUBERNETES_SERVICE_PORT").unwrap_or_else(|| "443".into());
            Some(if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            })
        }
        explicit => Some(explicit.to_string()),
    }
}

impl ReachCheck {
    /// Runs the check: `Ok(message)` when the target is unreachable (runs may start),
    /// `Err(message)` naming the cause when it stayed reachable for the whole wait.
    pub fn run(&self) -> Result<String, String> {
        let addrs = match self.addresses() {
            Ok(a) => a,
            Err(message) => return Ok(message),
        };
        let deadline = Instant::now() + self.wait;
        loop {
            let addr = match self.connect_any(&addrs) {
                Err(why) => {
                    return Ok(format!(
                        "{} is unreachable from the sandbox ({why})",
                        self.target
                    ));
                }
                Ok(addr) => addr,
            };
            if Instant::now() + RETRY_INTERVAL >= deadline {
                return Err(format!(
                    "the API server {} ({addr}) is reachable from the sandbox: the pod's network \
                     isolation is not in force (still reachable after {} ms); no program is run",
                    self.target,
                    self.wait.as_millis()
                ));
            }
            std::thread::sleep(RETRY_INTERVAL);
        }
    }

    /// After [`ReachCheck::run`] passed: checks again every `recheck` until a connect
    /// succeeds, and returns the message naming it (never returns while the target stays
    /// unreachable); `None` at once when `recheck` is zero (no watch). `since` is when `who`
    /// ("the agent", "the runner") started; the caller kills the running program before it
    /// shows the message.
    pub fn watch(&self, since: Instant, who: &str) -> Option<String> {
        if self.recheck.is_zero() {
            return None;
        }
        loop {
            std::thread::sleep(self.recheck);
            // Resolved again each time: a name may come to resolve once DNS is reachable.
            let Ok(addrs) = self.addresses() else {
                continue;
            };
            if let Ok(addr) = self.connect_any(&addrs) {
                return Some(format!(
                    "the API server {} ({addr}) became reachable from the sandbox {} ms after \
                     {who} started: the pod's network isolation is not in force; the running \
                     program was killed",
                    self.target,
                    since.elapsed().as_millis()
                ));
            }
        }
    }

    /// The target's addresses; `Err` (counted as unreachable) when it does not resolve.
    fn addresses(&self) -> Result<Vec<SocketAddr>, String> {
        match self.target.to_socket_addrs() {
            Ok(a) => Ok(a.collect()),
            // No resolver (a pod without DNS egress): nothing to connect to.
            Err(e) => Err(format!(
                "{} does not resolve ({e}): counted as unreachable",
                self.target
            )),
        }
    }

    /// One connect to each address: the first that answers, or why none did.
    fn connect_any(&self, addrs: &[SocketAddr]) -> Result<SocketAddr, String> {
        let mut last_err = None;
        for addr in addrs {
            match TcpStream::connect_timeout(addr, self.connect_timeout) {
                Ok(_) => return Ok(*addr),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.map_or_else(|| "no address".to_string(), |e| e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let env = |k: &str| match k {
            "KUBERNETES_SERVICE_HOST" => Some("10.0.0.1".to_string()),
            "KUBERNETES_SERVICE_PORT" => Some("443".to_string()),
            _ => None,
        };
        assert_eq!(target_from("auto", env).as_deref(), Some("10.0.0.1:443"));
        assert_eq!(target_from("off", env), None);
        assert_eq!(
            target_from("1.2.3.4:80", env).as_deref(),
            Some("1.2.3.4:80")
        );
        assert_eq!(target_from("auto", |_| None), None);
        let v6 = |k: &str| (k == "KUBERNETES_SERVICE_HOST").then(|| "fd00::1".to_string());
        assert_eq!(target_from("auto", v6).as_deref(), Some("[fd00::1]:443"));
    }
}
