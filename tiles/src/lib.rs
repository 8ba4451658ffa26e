//! A simulated RDU node's tiles, with no kubelet, gRPC server or Kubernetes client: what local mode needs and
//! what the device plugin serves.
//!
//! - [`topology`], [`packing`], [`affinity`]: device IDs, the packing rule of GetPreferredAllocation, the
//!   `SF_RNT_TILE_AFFINITY` mask.
//! - [`table`]: a node's tiles as plain data (health, allocations) and every operation on them; [`node`] wraps it
//!   with a lock, the device-list watch, [`metrics`] and the [`saved_allocations`] file, behind every device plugin
//!   call; [`simulated::SimulatedNode`] wraps the node for local mode.
//! - [`tilestat`]: the sntilestat document, its table, and a client that fetches it from a node.
//! - [`durable_file`]: replacing a file atomically and durably (the saved allocations, the DRA plugin's files).

pub mod affinity;
pub mod durable_file;
pub mod metrics;
pub mod node;
pub mod packing;
pub mod saved_allocations;
pub mod simulated;
pub mod table;
pub mod tilestat;
pub mod topology;
