//! Simulated RDU node topology, tile allocation and the kubelet device plugin server.
//!
//! - [`topology`], [`packing`], [`affinity`]: pure code: device IDs, the packing rule of
//!   GetPreferredAllocation, the `SF_RNT_TILE_AFFINITY` mask.
//! - [`node`]: the shared node state (health, allocations, checkpoint, metrics) behind every call;
//!   [`local::SimulatedNode`] wraps it for local mode.
//! - [`service`] (gRPC adapter), [`plugin`] (serve, register, re-register, shutdown), [`health`] (health
//!   file), [`podresources`] (pod and rank per tile), [`status`] + [`tilestat`] (the sntilestat endpoint).
//! - [`kubelet_double`]: a kubelet for tests and benchmarks.

pub mod affinity;
pub mod annotate;
pub mod checkpoint;
pub mod config;
pub mod health;
pub mod kubelet_double;
pub mod local;
pub mod metrics;
pub mod node;
pub mod packing;
pub mod plugin;
pub mod podresources;
pub mod service;
pub mod status;
pub mod tilestat;
pub mod topology;
pub mod transport;

/// The kubelet device plugin API v1beta1 (generated from `proto/deviceplugin/v1beta1/api.proto`).
pub mod api {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("v1beta1");
}

/// The part of the kubelet pod-resources API v1 the plugin reads
/// (generated from `proto/deviceplugin/podresources/v1/api.proto`).
pub mod podresources_api {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("v1");
}
