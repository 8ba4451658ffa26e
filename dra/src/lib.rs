//! A Dynamic Resource Allocation (`resource.k8s.io/v1`) kubelet plugin for simulated RDU tiles (driver `rdu.dev`).
//!
//! - [`devices`]: the ResourceSlices a node publishes (one device per tile).
//! - [`driver`]: the kubelet's DRAPlugin service (prepare, unprepare), over [`cdi`] specs and the [`prepared`]
//!   checkpoint, both written with [`atomic_file`], and the jobs' shared-memory [`domain`]s.
//! - [`publish`]: server-side apply of those slices.
//! - [`registration`]: the plugin registration service; [`socket`]: gRPC listeners on unix sockets, and
//!   [`authority`]: the relay that lets tonic accept the kubelet's requests on them.
//! - [`serve`]: all of them running for one node, configured by [`config`] (the `rdu-dra` binary's flags).

pub mod atomic_file;
pub mod authority;
pub mod cdi;
pub mod config;
pub mod devices;
pub mod domain;
pub mod driver;
pub mod prepared;
pub mod publish;
pub mod registration;
pub mod serve;
pub mod socket;

/// The kubelet DRA plugin API v1 (generated from `proto/dra/dra/v1/api.proto`).
pub mod api {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// The kubelet plugin registration API (generated from `proto/dra/pluginregistration/v1/api.proto`).
pub mod registration_api {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("pluginregistration");
}
