//! toolrun's wire contract: the `toolrun.v1` protobuf types and `ToolService` stubs, and the
//! operator's `SessionRelay` (how the gateway reaches a session pod's agent on Kubernetes).
//!
//! Generated at build time from `proto/toolrun/v1/toolrun.proto` and
//! `proto/toolrun/v1/relay.proto`; nothing here knows about servers, sandboxes or Kubernetes.

/// `toolrun.v1` messages, client and server.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("toolrun.v1");

    /// Encoded `FileDescriptorSet` for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("toolrun_descriptor");
}

/// `toolrun.v1.SessionRelay` (relay.proto): served by the operator, called by the gateway.
pub mod relay {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/relay/toolrun.v1.rs"));

    /// Encoded `FileDescriptorSet` of relay.proto.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("relay_descriptor");
}
