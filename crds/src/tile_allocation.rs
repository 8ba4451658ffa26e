//! `spec.tileAllocation`: how a rank's tiles are asked for, the device plugin's extended resource or a
//! ResourceClaim through Dynamic Resource Allocation (DESIGN 4.3.1). Its schema and CEL live here with the messages
//! `validation::tiles` repeats.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// The DRA driver of RDU tiles, and the name of the DeviceClass the chart installs with it
/// (`devicePlugin.kubeletApi: dra`).
pub const DRIVER: &str = "rdu.dev";
/// Device attribute: the tile's RDU (int); what `sameRdu` matches on.
pub const RDU_ATTRIBUTE: &str = "rdu.dev/rdu";
/// Device attribute: the tile's index within its RDU (int).
pub const TILE_ATTRIBUTE: &str = "rdu.dev/tile";
/// Device attribute: the RDU model (string), such as `SN30`; what `model` selects on.
pub const MODEL_ATTRIBUTE: &str = "rdu.dev/model";
/// Longest `model`: a DRA string attribute's values are at most 64 bytes.
pub const MAX_MODEL_LEN: usize = 64;

pub const SAME_RDU_NEEDS_DRA: &str = "spec.tileAllocation.sameRdu needs spec.tileAllocation.api dra: the device \
     plugin cannot keep a rank's tiles on one RDU; set api to dra (nodes run the chart with \
     devicePlugin.kubeletApi=dra) or drop sameRdu";
pub const MODEL_NEEDS_DRA: &str = "spec.tileAllocation.model needs spec.tileAllocation.api dra: the device plugin \
     cannot select an RDU model; set api to dra (nodes run the chart with devicePlugin.kubeletApi=dra) or drop model";
pub const MODEL_FORM: &str = "spec.tileAllocation.model must be 1 to 64 letters, digits, '.', '_' or '-', starting \
     with a letter or digit: the RDU model the DRA plugin publishes (its rdu.dev/model attribute, such as SN30)";

/// How each rank's `tilesPerWorker` tiles are asked for.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.api) && self.api == 'dra') || !has(self.sameRdu) || !self.sameRdu").message(SAME_RDU_NEEDS_DRA))]
#[x_kube(validation = Rule::new("(has(self.api) && self.api == 'dra') || !has(self.model)").message(MODEL_NEEDS_DRA))]
pub struct TileAllocation {
    /// `devicePlugin` (the default): the extended resource `rdu.dev/tile`, which the device plugin advertises.
    /// `dra`: a ResourceClaim per rank from a ResourceClaimTemplate the operator makes (DeviceClass `rdu.dev`),
    /// allocated by the scheduler from the ResourceSlices of the DRA plugin (the chart's
    /// `devicePlugin.kubeletApi: dra`).
    #[serde(default)]
    pub api: TileApi,
    /// `dra` only: every tile of a rank on one RDU (a whole RDU when `tilesPerWorker` is its tile count).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub same_rdu: bool,
    /// `dra` only: the RDU model the tiles must be (the `rdu.dev/model` attribute, such as SN30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$')").message(MODEL_FORM))]
    pub model: Option<String>,
}

/// Which kubelet API serves a rank's tiles.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum TileApi {
    /// The device plugin's extended resource `rdu.dev/tile`.
    #[default]
    DevicePlugin,
    /// Dynamic Resource Allocation: a ResourceClaim per rank.
    Dra,
}

impl TileAllocation {
    /// Whether the tiles come through a ResourceClaim.
    pub fn is_dra(&self) -> bool {
        self.api == TileApi::Dra
    }
}

/// `^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`, the CEL rule's pattern: nothing a CEL string literal or selector could be
/// broken out of.
pub fn model_is_valid(model: &str) -> bool {
    let bytes = model.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_MODEL_LEN
        && bytes[0].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_the_device_plugin() {
        let parsed: TileAllocation = serde_json::from_str("{}").expect("empty");
        assert_eq!(parsed, TileAllocation::default());
        assert!(!parsed.is_dra());
        assert_eq!(
            serde_json::to_value(&parsed).expect("json"),
            serde_json::json!({"api": "devicePlugin"})
        );
    }
}
