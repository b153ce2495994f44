//! toolrun's wire contract: the `toolrun.v1` protobuf types and `ToolService` stubs.
//!
//! Generated at build time from `proto/toolrun/v1/toolrun.proto`; nothing here knows about
//! servers, sandboxes or Kubernetes.

/// `toolrun.v1` messages, client and server.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("toolrun.v1");

    /// Encoded `FileDescriptorSet` for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("toolrun_descriptor");
}
