//! toolrun: a gateway that validates and runs AI agents' tool calls.
//!
//! Layers, inward first: [`error`], [`tool`] and [`canonical`] (the tool abstraction),
//! [`registry`] and [`exec`] (the per-call flow), [`tools`] (built-ins), [`sandbox`]
//! (where untrusted code runs), then the servers and the CLI.

pub mod admin;
pub mod approval;
pub mod audit;
pub mod auth;
pub mod bench;
pub mod canonical;
pub mod cli;
pub mod config;
pub mod error;
pub mod exec;
pub mod grpc;
pub mod http;
pub mod inflight;
pub mod mcp;
pub mod metrics;
pub mod providers;
pub mod registry;
pub mod sandbox;
pub mod serve;
pub mod session;
pub mod tool;
pub mod tools;
pub mod validation;
