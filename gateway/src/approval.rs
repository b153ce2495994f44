//! Pending approvals: the one owner of every call waiting for a human's decision.
//!
//! A call that needs approval registers an [`ApprovalInfo`] here and waits on its
//! [`Waiter`]; approvers list, watch and decide. Each approval is decided at most once: the
//! decision removes it from the table before it reaches the waiting call, so a second
//! decision (or one for an unknown id) is refused. A waiter that gives up (timeout, caller
//! gone, session closed) removes its approval too, so nobody can approve a call that no
//! longer waits.
//!
//! Approvals belong to the tenant whose call asked: another tenant neither lists, watches,
//! reads nor decides them (to it they do not exist: the same NotFound as an unknown id).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde_json::Value;
use tokio::sync::{broadcast, oneshot};
use tokio_util::sync::CancellationToken;

/// What an approval would allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalKind {
    /// Reads workspace files.
    Read,
    /// Creates or changes files.
    Write,
    /// Runs a program or command.
    Execute,
    /// Deletes or overwrites what cannot be recovered.
    Destructive,
}

impl ApprovalKind {
    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalKind::Read => "read",
            ApprovalKind::Write => "write",
            ApprovalKind::Execute => "execute",
            ApprovalKind::Destructive => "destructive",
        }
    }
}

/// What a tool asks its approver for one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalAsk {
    /// What the call would do.
    pub kind: ApprovalKind,
    /// Human-readable reason (for writes and edits, with a diff preview).
    pub reason: String,
}

/// One pending approval, as approvers see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApprovalInfo {
    /// Unguessable id (`ap-` and 32 hex digits).
    pub approval_id: String,
    /// The tenant whose call waits (only it sees and decides the approval).
    #[serde(skip)]
    pub tenant: String,
    /// The session the call runs in.
    pub session_id: String,
    /// The call waiting.
    pub call_id: String,
    /// Canonical tool id.
    pub tool: String,
    /// The arguments as asked (JSON text).
    pub arguments_json: String,
    /// Why it needs approval, with a preview of the change.
    pub reason: String,
    /// What it would do.
    pub kind: ApprovalKind,
    /// When it was asked.
    #[serde(skip)]
    pub requested_at: SystemTime,
    /// When the call stops waiting.
    #[serde(skip)]
    pub expires_at: SystemTime,
}

/// An approver's decision.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Run the call, with these arguments when given (already checked against the tool's
    /// schema by the caller of [`Approvals::decide`]).
    Approve {
        /// Modified arguments.
        arguments: Option<Value>,
        /// Optional note for the model.
        message: String,
    },
    /// Do not run it.
    Deny {
        /// Why, for the model.
        message: String,
    },
}

/// How a wait ended.
#[derive(Debug, Clone, PartialEq)]
pub enum WaitOutcome {
    /// An approver decided.
    Decided(Decision),
    /// No decision before the deadline.
    TimedOut,
    /// The call was cancelled (caller gone, session closed, shutdown).
    Cancelled,
}

/// Why a decision was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    /// No pending approval has this id: unknown, already decided, or expired.
    #[error("no pending approval {0:?} (unknown, already decided, or no longer waiting)")]
    NotFound(String),
}

struct Pending {
    info: ApprovalInfo,
    tx: oneshot::Sender<Decision>,
}

/// The table of pending approvals.
pub struct Approvals {
    pending: Mutex<HashMap<String, Pending>>,
    events: broadcast::Sender<ApprovalInfo>,
}

impl Default for Approvals {
    fn default() -> Self {
        Self::new()
    }
}

impl Approvals {
    /// An empty table.
    pub fn new() -> Self {
        Approvals {
            pending: Mutex::new(HashMap::new()),
            events: broadcast::channel(1024).0,
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers an approval for a call and tells the watchers; the call then waits on
    /// the returned [`Waiter`].
    #[allow(clippy::too_many_arguments)]
    pub fn ask(
        self: &Arc<Self>,
        tenant: &str,
        session_id: &str,
        call_id: &str,
        tool: &str,
        arguments: &Value,
        ask: ApprovalAsk,
        timeout: Duration,
    ) -> Waiter {
        let now = SystemTime::now();
        let info = ApprovalInfo {
            approval_id: format!("ap-{}", uuid::Uuid::new_v4().simple()),
            tenant: tenant.to_string(),
            session_id: session_id.to_string(),
            call_id: call_id.to_string(),
            tool: tool.to_string(),
            arguments_json: arguments.to_string(),
            reason: ask.reason,
            kind: ask.kind,
            requested_at: now,
            expires_at: now + timeout,
        };
        let (tx, rx) = oneshot::channel();
        self.table().insert(
            info.approval_id.clone(),
            Pending {
                info: info.clone(),
                tx,
            },
        );
        tracing::info!(
            approval_id = %info.approval_id,
            tenant,
            session_id,
            call_id,
            tool,
            kind = info.kind.as_str(),
            "approval requested"
        );
        // No watcher is fine: ListApprovals still shows it.
        let _ = self.events.send(info.clone());
        Waiter {
            approvals: self.clone(),
            info,
            rx: Some(rx),
        }
    }

    /// `tenant`'s pending approvals, oldest first; only `session_id`'s when given.
    pub fn list(&self, session_id: Option<&str>, tenant: &str) -> Vec<ApprovalInfo> {
        let mut v: Vec<ApprovalInfo> = self
            .table()
            .values()
            .filter(|p| p.info.tenant == tenant)
            .filter(|p| session_id.is_none_or(|s| p.info.session_id == s))
            .map(|p| p.info.clone())
            .collect();
        v.sort_by_key(|a| a.requested_at);
        v
    }

    /// The pending approval `id` of `tenant`, if it still waits.
    pub fn get(&self, id: &str, tenant: &str) -> Option<ApprovalInfo> {
        self.table()
            .get(id)
            .filter(|p| p.info.tenant == tenant)
            .map(|p| p.info.clone())
    }

    /// `tenant`'s approvals pending now (only `session_id`'s when given), and a watch of
    /// each new one (subscribed first, so none is missed between the two; a new one may
    /// appear in both).
    pub fn watch(&self, session_id: Option<&str>, tenant: &str) -> (Vec<ApprovalInfo>, Watch) {
        let rx = self.events.subscribe();
        let watch = Watch {
            rx,
            session_id: session_id.map(str::to_string),
            tenant: tenant.to_string(),
        };
        (self.list(session_id, tenant), watch)
    }

    /// Decides `tenant`'s approval `id` once: it leaves the table before the waiting call
    /// hears.
    pub fn decide(
        &self,
        id: &str,
        tenant: &str,
        decision: Decision,
    ) -> Result<ApprovalInfo, DecideError> {
        let pending = {
            let mut table = self.table();
            if table.get(id).is_none_or(|p| p.info.tenant != tenant) {
                return Err(DecideError::NotFound(id.to_string()));
            }
            table
                .remove(id)
                .ok_or_else(|| DecideError::NotFound(id.to_string()))?
        };
        let approved = matches!(decision, Decision::Approve { .. });
        tracing::info!(
            approval_id = id,
            tenant,
            session_id = %pending.info.session_id,
            call_id = %pending.info.call_id,
            approved,
            "approval decided"
        );
        // The waiter may have given up in between (it removes its entry first, so this is
        // a narrow race): the decision then has nobody to reach, which is what happened.
        let _ = pending.tx.send(decision);
        Ok(pending.info)
    }

    /// Drops every approval of `session_id` (closed or expired): their calls see
    /// [`WaitOutcome::Cancelled`].
    pub fn drop_session(&self, session_id: &str) -> usize {
        let mut table = self.table();
        let before = table.len();
        table.retain(|_, p| p.info.session_id != session_id);
        before - table.len()
    }

    /// Approvals pending now.
    pub fn len(&self) -> usize {
        self.table().len()
    }

    /// No approval is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// New approvals of one tenant (and session, when given), as they are asked.
pub struct Watch {
    rx: broadcast::Receiver<ApprovalInfo>,
    session_id: Option<String>,
    tenant: String,
}

impl Watch {
    /// The next matching approval; `Err(Lagged)` when this watcher fell behind.
    pub async fn next(&mut self) -> Result<ApprovalInfo, broadcast::error::RecvError> {
        loop {
            let a = self.rx.recv().await?;
            if a.tenant == self.tenant
                && self.session_id.as_ref().is_none_or(|s| *s == a.session_id)
            {
                return Ok(a);
            }
        }
    }
}

/// A call's side of one approval. Dropping it withdraws the approval.
pub struct Waiter {
    approvals: Arc<Approvals>,
    info: ApprovalInfo,
    rx: Option<oneshot::Receiver<Decision>>,
}

impl Waiter {
    /// The approval as asked.
    pub fn info(&self) -> &ApprovalInfo {
        &self.info
    }

    /// Waits for the decision until `deadline` or `cancel`.
    pub async fn wait(
        mut self,
        deadline: tokio::time::Instant,
        cancel: &CancellationToken,
    ) -> WaitOutcome {
        let Some(rx) = self.rx.take() else {
            return WaitOutcome::Cancelled;
        };
        tokio::select! {
            r = rx => match r {
                Ok(decision) => WaitOutcome::Decided(decision),
                // Dropped from the table without a decision: the session went away.
                Err(_) => WaitOutcome::Cancelled,
            },
            _ = tokio::time::sleep_until(deadline) => WaitOutcome::TimedOut,
            _ = cancel.cancelled() => WaitOutcome::Cancelled,
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.approvals.table().remove(&self.info.approval_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ask(a: &Arc<Approvals>, session: &str) -> Waiter {
        a.ask(
            "",
            session,
            "c1",
            "delete_file",
            &json!({"path": "x"}),
            ApprovalAsk {
                kind: ApprovalKind::Destructive,
                reason: "delete x".into(),
            },
            Duration::from_secs(60),
        )
    }

    #[tokio::test]
    async fn one_decision_per_approval() {
        let a = Arc::new(Approvals::new());
        let w = ask(&a, "s1");
        let id = w.info().approval_id.clone();
        assert_eq!(a.list(Some("s1"), "").len(), 1);
        assert!(a.list(Some("s2"), "").is_empty());
        // Another tenant sees nothing and cannot decide.
        assert!(a.list(None, "other").is_empty());
        assert!(a.get(&id, "other").is_none());
        assert_eq!(
            a.decide(
                &id,
                "other",
                Decision::Deny {
                    message: String::new()
                }
            ),
            Err(DecideError::NotFound(id.clone()))
        );
        assert!(a.get(&id, "").is_some());
        let waiting = tokio::spawn(async move {
            w.wait(
                tokio::time::Instant::now() + Duration::from_secs(5),
                &CancellationToken::new(),
            )
            .await
        });
        a.decide(
            &id,
            "",
            Decision::Deny {
                message: "no".into(),
            },
        )
        .unwrap();
        assert_eq!(
            a.decide(
                &id,
                "",
                Decision::Approve {
                    arguments: None,
                    message: String::new()
                }
            ),
            Err(DecideError::NotFound(id.clone()))
        );
        assert_eq!(
            waiting.await.unwrap(),
            WaitOutcome::Decided(Decision::Deny {
                message: "no".into()
            })
        );
        assert!(a.is_empty());
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_withdraws_its_approval() {
        let a = Arc::new(Approvals::new());
        let w = ask(&a, "s1");
        let id = w.info().approval_id.clone();
        let out = w
            .wait(
                tokio::time::Instant::now() + Duration::from_millis(20),
                &CancellationToken::new(),
            )
            .await;
        assert_eq!(out, WaitOutcome::TimedOut);
        assert!(a.is_empty());
        assert!(matches!(
            a.decide(
                &id,
                "",
                Decision::Approve {
                    arguments: None,
                    message: String::new()
                }
            ),
            Err(DecideError::NotFound(_))
        ));
    }

    #[tokio::test]
    async fn closing_a_session_cancels_its_waiters_only() {
        let a = Arc::new(Approvals::new());
        let w1 = ask(&a, "s1");
        let _w2 = ask(&a, "s2");
        assert_eq!(a.drop_session("s1"), 1);
        let out = w1
            .wait(
                tokio::time::Instant::now() + Duration::from_secs(5),
                &CancellationToken::new(),
            )
            .await;
        assert_eq!(out, WaitOutcome::Cancelled);
        assert_eq!(a.list(None, "").len(), 1);
    }

    #[tokio::test]
    async fn watchers_see_new_approvals() {
        let a = Arc::new(Approvals::new());
        let _w0 = ask(&a, "s1");
        let (now, mut rx) = a.watch(None, "");
        let (_, mut other) = a.watch(None, "other");
        assert_eq!(now.len(), 1);
        let w1 = ask(&a, "s1");
        assert_eq!(rx.next().await.unwrap().approval_id, w1.info().approval_id);
        let nothing = tokio::time::timeout(Duration::from_millis(50), other.next()).await;
        assert!(nothing.is_err(), "another tenant's watch sees nothing");
    }
}
