//! The kubelet device plugin of a simulated RDU node: the gRPC service, registration with the kubelet, health,
//! pod resources and the status endpoint. The tiles themselves (topology, packing, allocations) are `rdu_tiles`.
//!
//! - [`service`] (gRPC adapter over `rdu_tiles::node::TileNode`), [`plugin`] (serve, register, re-register,
//!   shutdown), [`unix_socket`] (gRPC over unix sockets).
//! - [`health`] (the health file), [`podresources`] (pod and rank per tile), [`annotate`] (tiles on the pods),
//!   [`status`] (the sntilestat endpoint and /metrics), [`config`].
//! - `kubelet_double` (feature `kubelet-double`): a kubelet for tests and benchmarks.

pub mod annotate;
pub mod config;
pub mod health;
#[cfg(feature = "kubelet-double")]
pub mod kubelet_double;
pub mod plugin;
pub mod podresources;
pub mod service;
pub mod status;
pub mod unix_socket;

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
