//! The toolrun operator: turns each ToolRun into a ConfigMap and a locked-down pod, and
//! the runner's record in the pod's log into the ToolRun's status.
//!
//! So far the pure parts, configured by [`config::OperatorConfig`]: [`builders`]
//! (ToolRun -> ConfigMap, Pod; namespace -> NetworkPolicy), [`record`] (pod log ->
//! runner record) and [`status`] (record or finished pod -> ToolRun status). The
//! controller that fetches and applies comes next.

pub mod builders;
pub mod config;
pub mod record;
pub mod status;

pub use builders::BuildError;
pub use config::OperatorConfig;
pub use record::{RecordError, record_from_log};
