//! The ToolRun kind: each ToolRun becomes a ConfigMap and a locked-down pod (or binds to a
//! warm pod), and the runner's record becomes the ToolRun's status.
//!
//! - [`builders`] (ToolRun -> ConfigMap, Pod; the agent pod of every kind; namespace ->
//!   NetworkPolicy), [`record`] (pod log -> runner record) and [`status`] (record or
//!   finished pod -> status): pure;
//! - [`decide`]: the reconciler's decision, pure;
//! - [`controller`]: the kube-runtime controller that observes and carries the decisions
//!   out; [`follow`]: followers of running pods' logs, so results are recorded as soon as
//!   the runner writes them.

pub mod builders;
pub mod controller;
pub mod decide;
pub mod follow;
pub mod record;
pub mod status;
