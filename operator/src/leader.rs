//! Leader election on a `coordination.k8s.io` Lease, so two replicas are safe: only the
//! holder reconciles, and a replica that sees the lease taken by another stops.
//!
//! Built on `kube-lease-manager` (made for kube 5; it takes and renews the lease with
//! server-side apply, so two replicas cannot both write themselves as holder). Mapping of
//! the configuration: `leaseDurationSeconds` is the lease's validity after a renewal;
//! the holder renews `leaseDurationSeconds - renewDeadlineSeconds` before it expires (the
//! margin that also absorbs clock skew between nodes). The crate paces a follower's
//! retries itself (short backoff), so `retryPeriodSeconds` is accepted but only bounds
//! how often this module re-checks after an error.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::Identity;
use crate::config::LeaderElectionConfig;

/// Why leader election could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Creating or reading the Lease failed.
    #[error("leader election on Lease {namespace}/{name}: {source}")]
    Lease {
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// Why.
        #[source]
        source: LeaseManagerError,
    },
}

/// This replica's part in the election.
pub struct Leadership {
    leading: watch::Receiver<bool>,
    task: JoinHandle<Result<LeaseManager, LeaseManagerError>>,
    retry: Duration,
}

impl Leadership {
    /// Starts competing for the lease (created when missing).
    pub async fn start(
        client: Client,
        config: &LeaderElectionConfig,
        identity: &Identity,
    ) -> Result<Leadership, Error> {
        let err = |source| Error::Lease {
            namespace: identity.lease_namespace.clone(),
            name: config.lease_name.clone(),
            source,
        };
        let grace = config
            .lease_duration_seconds
            .saturating_sub(config.renew_deadline_seconds)
            .max(1);
        let manager = LeaseManagerBuilder::new(client, &config.lease_name)
            .with_namespace(&identity.lease_namespace)
            .with_identity(&identity.name)
            .with_duration(config.lease_duration_seconds.into())
            .with_grace(grace.into())
            // One field manager per replica: the lease's holder fields are then owned
            // by whoever took it, and a stale replica's apply conflicts.
            .with_field_manager(format!("toolrun-operator/{}", identity.name))
            .build()
            .await
            .map_err(err)?;
        let (leading, task) = manager.watch().await;
        info!(lease = %config.lease_name, namespace = %identity.lease_namespace, identity = %identity.name, "competing for the lease");
        Ok(Leadership {
            leading,
            task,
            retry: Duration::from_secs(config.retry_period_seconds.into()),
        })
    }

    /// Waits until this replica holds the lease; false when the election ended.
    pub async fn wait_until_leader(&mut self) -> bool {
        loop {
            let leading = self.leading.wait_for(|l| *l).await.is_ok();
            if leading {
                return true;
            }
            if self.task.is_finished() {
                return false;
            }
            tokio::time::sleep(self.retry).await;
        }
    }

    /// Cancels `term` as soon as this replica no longer holds the lease (or the
    /// election task ends).
    pub fn stop_on_loss(&self, term: CancellationToken) -> JoinHandle<()> {
        let mut leading = self.leading.clone();
        tokio::spawn(async move {
            let _ = leading.wait_for(|l| !*l).await;
            term.cancel();
        })
    }

    /// Gives the lease up (when held) so another replica takes over at once.
    pub async fn release(self) {
        drop(self.leading);
        match self.task.await {
            Ok(Ok(_)) => info!("released the lease"),
            Ok(Err(e)) => warn!(error = %e, "releasing the lease failed"),
            Err(e) => warn!(error = %e, "the lease task failed"),
        }
    }
}
