//! Sessions on Kubernetes (`ToolSession`): the operator's side.
//!
//! - [`relay_server`]: `toolrun.v1.SessionRelay`, the gRPC service through which the gateway
//!   runs file operations in a session pod's agent (the gateway never attaches to pods).

pub mod relay_server;
