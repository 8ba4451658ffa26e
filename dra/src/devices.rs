//! The ResourceSlices a node publishes for driver `rdu.dev`: one device per tile (`rdu<R>-tile<T>`) in a pool named
//! after the node, split into slices of at most [`MAX_DEVICES_PER_SLICE`] devices.

use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rdu_crds::tile_allocation;
use rdu_tiles::topology::{ResourceMode, Topology};
use std::collections::BTreeMap;

/// The DRA driver name: DeviceClasses select it, allocation results and ResourceSlices carry it; the operator's
/// claim templates name it (one constant for both sides: `rdu_crds::tile_allocation`).
pub const DRIVER_NAME: &str = tile_allocation::DRIVER;
/// Attribute: the tile's RDU (int).
pub const ATTR_RDU: &str = tile_allocation::RDU_ATTRIBUTE;
/// Attribute: the tile's index within its RDU (int).
pub const ATTR_TILE: &str = tile_allocation::TILE_ATTRIBUTE;
/// Attribute: the RDU model (string), e.g. `SN30`.
pub const ATTR_MODEL: &str = tile_allocation::MODEL_ATTRIBUTE;
/// Most devices one ResourceSlice may hold (`resource.k8s.io/v1` `ResourceSliceMaxDevices`).
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// Longest DNS subdomain, the limit of an object name and of a pool name.
const MAX_NAME_LEN: usize = 253;

/// Errors building a node's ResourceSlices.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DevicesError {
    #[error("the node name is empty; the pool and the ResourceSlices are named after the node")]
    EmptyNodeName,
    #[error(
        "node name `{0}` is too long for a ResourceSlice name (`<node>-rdu.dev-<n>`, at most {MAX_NAME_LEN} characters)"
    )]
    NodeNameTooLong(String),
    #[error("the RDU model is empty; set it to the model the node's RDUs are (e.g. SN30)")]
    EmptyModel,
}

/// The name of the `index`-th ResourceSlice of `node`.
pub fn slice_name(node: &str, index: usize) -> String {
    format!("{node}-{DRIVER_NAME}-{index}")
}

/// One device per tile of `topology`, in tile order, with the `rdu.dev/{rdu,tile,model}` attributes.
pub fn tile_devices(topology: &Topology, model: &str) -> Vec<Device> {
    (0..topology.total_tiles())
        .map(|index| Device {
            name: topology.tile_id(index),
            attributes: Some(BTreeMap::from([
                (ATTR_RDU.to_string(), int(topology.rdu_of(index))),
                (ATTR_TILE.to_string(), int(topology.tile_of(index))),
                (
                    ATTR_MODEL.to_string(),
                    DeviceAttribute {
                        string: Some(model.to_string()),
                        ..DeviceAttribute::default()
                    },
                ),
            ])),
            ..Device::default()
        })
        .collect()
}

fn int(value: u32) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(i64::from(value)),
        ..DeviceAttribute::default()
    }
}

/// The ResourceSlices of `node`: pool `node` at `generation`, every tile of `topology` as a device.
pub fn resource_slices(
    node: &str,
    topology: &Topology,
    model: &str,
    generation: i64,
) -> Result<Vec<ResourceSlice>, DevicesError> {
    if node.is_empty() {
        return Err(DevicesError::EmptyNodeName);
    }
    if model.is_empty() {
        return Err(DevicesError::EmptyModel);
    }
    let devices = tile_devices(topology, model);
    let chunks: Vec<&[Device]> = devices.chunks(MAX_DEVICES_PER_SLICE).collect();
    if slice_name(node, chunks.len()).len() > MAX_NAME_LEN {
        return Err(DevicesError::NodeNameTooLong(node.to_string()));
    }
    let count = chunks.len() as i64;
    Ok(chunks
        .iter()
        .enumerate()
        .map(|(index, chunk)| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(node, index)),
                ..ObjectMeta::default()
            },
            spec: ResourceSliceSpec {
                driver: DRIVER_NAME.to_string(),
                node_name: Some(node.to_string()),
                pool: ResourcePool {
                    name: node.to_string(),
                    generation,
                    resource_slice_count: count,
                },
                devices: Some(chunk.to_vec()),
                ..ResourceSliceSpec::default()
            },
        })
        .collect())
}

/// Whether `name` is a device this node publishes (a tile of `topology`).
pub fn has_device(topology: &Topology, name: &str) -> bool {
    topology.parse_device(ResourceMode::Tile, name).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr<'a>(device: &'a Device, key: &str) -> &'a DeviceAttribute {
        &device.attributes.as_ref().expect("attributes")[key]
    }

    #[test]
    fn an_8x4_node_publishes_one_slice_of_32_tiles() {
        let topo = Topology::new(8, 4).unwrap();
        let slices = resource_slices("node-a", &topo, "SN30", 3).unwrap();
        assert_eq!(slices.len(), 1);
        let slice = &slices[0];
        assert_eq!(slice.metadata.name.as_deref(), Some("node-a-rdu.dev-0"));
        assert_eq!(slice.spec.driver, "rdu.dev");
        assert_eq!(slice.spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(slice.spec.pool.name, "node-a");
        assert_eq!(slice.spec.pool.generation, 3);
        assert_eq!(slice.spec.pool.resource_slice_count, 1);
        let devices = slice.spec.devices.as_ref().unwrap();
        assert_eq!(devices.len(), 32);
        let d = &devices[topo.tile_index(6, 1) as usize];
        assert_eq!(d.name, "rdu6-tile1");
        assert_eq!(attr(d, ATTR_RDU).int, Some(6));
        assert_eq!(attr(d, ATTR_TILE).int, Some(1));
        assert_eq!(attr(d, ATTR_MODEL).string.as_deref(), Some("SN30"));
        assert_eq!(d.attributes.as_ref().unwrap().len(), 3);
    }

    #[test]
    fn device_names_are_dns_labels_and_unique() {
        let topo = Topology::new(4, 8).unwrap();
        let devices = tile_devices(&topo, "SN30");
        let mut names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
        for name in &names {
            assert!(name.len() <= 63, "{name}");
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "{name}"
            );
            assert!(has_device(&topo, name), "{name}");
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 32);
        assert!(!has_device(&topo, "rdu4-tile0"));
        assert!(!has_device(&topo, "rdu0"));
    }

    #[test]
    fn big_nodes_split_into_slices_of_at_most_128_devices() {
        let topo = Topology::new(20, 16).unwrap();
        let slices = resource_slices("big", &topo, "SN40", 1).unwrap();
        let sizes: Vec<usize> = slices
            .iter()
            .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
            .collect();
        assert_eq!(sizes, vec![128, 128, 64]);
        for (i, s) in slices.iter().enumerate() {
            assert_eq!(s.spec.pool.resource_slice_count, 3);
            assert_eq!(
                s.metadata.name.as_deref(),
                Some(slice_name("big", i).as_str())
            );
        }
        let last = slices[2].spec.devices.as_ref().unwrap().last().unwrap();
        assert_eq!(last.name, "rdu19-tile15");
    }

    #[test]
    fn refuses_empty_or_overlong_names() {
        let topo = Topology::new(1, 1).unwrap();
        assert_eq!(
            resource_slices("", &topo, "SN30", 1),
            Err(DevicesError::EmptyNodeName)
        );
        assert_eq!(
            resource_slices("n", &topo, "", 1),
            Err(DevicesError::EmptyModel)
        );
        let long = "n".repeat(250);
        assert!(matches!(
            resource_slices(&long, &topo, "SN30", 1),
            Err(DevicesError::NodeNameTooLong(_))
        ));
    }
}
