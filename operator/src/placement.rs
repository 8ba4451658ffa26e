//! Where a queue's admission puts a job's pods (`kueue`): the node labels and tolerations of the ResourceFlavors
//! its pod set was admitted on, and the labels, annotations, node selector and tolerations admission checks ask
//! for (`podSetUpdates`), merged as Kueue's `podset.Merge` does: a node-selector or label key given two different
//! values is a conflict, never silently overwritten. The builders put it on every rank's pod (`ValidJob::placement`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Toleration};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What an admission adds to every pod of the job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// Two sources of an admission disagree.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("the admission gives {field} {key:?} two values, {first:?} and {second:?}")]
pub struct PlacementConflict {
    pub field: &'static str,
    pub key: String,
    pub first: String,
    pub second: String,
}

impl Placement {
    /// The placement of `flavors` (ResourceFlavor objects as JSON) and `updates` (the pod set's entries of the
    /// admission checks' `podSetUpdates`), with `labels` (the pod set label Kueue gives its pods).
    pub fn of(
        flavors: &[Value],
        updates: &[Value],
        labels: BTreeMap<String, String>,
    ) -> Result<Placement, PlacementConflict> {
        let mut placement = Placement {
            labels,
            ..Placement::default()
        };
        for flavor in flavors {
            let spec = &flavor["spec"];
            placement.add_map("nodeSelector", &spec["nodeLabels"])?;
            placement.add_tolerations(&spec["tolerations"]);
        }
        for update in updates {
            placement.add_map("nodeSelector", &update["nodeSelector"])?;
            placement.add_map("labels", &update["labels"])?;
            placement.add_map("annotations", &update["annotations"])?;
            placement.add_tolerations(&update["tolerations"]);
        }
        Ok(placement)
    }

    fn add_map(&mut self, field: &'static str, entries: &Value) -> Result<(), PlacementConflict> {
        let target = match field {
            "nodeSelector" => &mut self.node_selector,
            "labels" => &mut self.labels,
            _ => &mut self.annotations,
        };
        merge(target, field, entries.as_object().into_iter().flatten())
    }

    fn add_tolerations(&mut self, tolerations: &Value) {
        let parsed: Vec<Toleration> =
            serde_json::from_value(tolerations.clone()).unwrap_or_default();
        for t in parsed {
            if !self.tolerations.contains(&t) {
                self.tolerations.push(t);
            }
        }
    }

    /// Adds the placement to `pod` (its own node selector, tolerations, labels and annotations stay; a key the
    /// pod already has with another value is a conflict).
    pub fn apply(&self, pod: &mut Pod) -> Result<(), PlacementConflict> {
        let meta = &mut pod.metadata;
        let labels = meta.labels.get_or_insert_default();
        merge_into(labels, "labels", &self.labels)?;
        let annotations = meta.annotations.get_or_insert_default();
        merge_into(annotations, "annotations", &self.annotations)?;
        let spec = pod.spec.get_or_insert_default();
        let selector = spec.node_selector.get_or_insert_default();
        merge_into(selector, "nodeSelector", &self.node_selector)?;
        let tolerations = spec.tolerations.get_or_insert_default();
        for t in &self.tolerations {
            if !tolerations.contains(t) {
                tolerations.push(t.clone());
            }
        }
        Ok(())
    }
}

fn merge<'a>(
    target: &mut BTreeMap<String, String>,
    field: &'static str,
    entries: impl Iterator<Item = (&'a String, &'a Value)>,
) -> Result<(), PlacementConflict> {
    for (key, value) in entries {
        let value = value.as_str().unwrap_or_default().to_string();
        insert(target, field, key, value)?;
    }
    Ok(())
}

fn merge_into(
    target: &mut BTreeMap<String, String>,
    field: &'static str,
    entries: &BTreeMap<String, String>,
) -> Result<(), PlacementConflict> {
    for (key, value) in entries {
        insert(target, field, key, value.clone())?;
    }
    Ok(())
}

fn insert(
    target: &mut BTreeMap<String, String>,
    field: &'static str,
    key: &str,
    value: String,
) -> Result<(), PlacementConflict> {
    match target.get(key) {
        Some(existing) if *existing != value => Err(PlacementConflict {
            field,
            key: key.to_string(),
            first: existing.clone(),
            second: value,
        }),
        _ => {
            target.insert(key.to_string(), value);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use serde_json::json;

    fn flavor(labels: Value, tolerations: Value) -> Value {
        json!({"spec": {"nodeLabels": labels, "tolerations": tolerations}})
    }

    #[test]
    fn flavors_and_admission_checks_merge_into_the_pods() {
        let flavors = [flavor(
            json!({"rdu.dev/pool": "a"}),
            json!([{"key": "rdu.dev/reserved", "operator": "Exists", "effect": "NoSchedule"}]),
        )];
        let updates = [
            json!({"name": "main", "labels": {"team": "x"}, "nodeSelector": {"zone": "z1"},
                              "annotations": {"note": "n"}}),
        ];
        let podset = [("kueue.x-k8s.io/podset".to_string(), "main".to_string())].into();
        let placement = Placement::of(&flavors, &updates, podset).unwrap();
        let mut pod = Pod {
            spec: Some(PodSpec {
                node_selector: Some([("disk".to_string(), "ssd".to_string())].into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        placement.apply(&mut pod).unwrap();
        let spec = pod.spec.as_ref().unwrap();
        let selector = spec.node_selector.as_ref().unwrap();
        assert_eq!(selector["rdu.dev/pool"], "a");
        assert_eq!(selector["zone"], "z1");
        assert_eq!(selector["disk"], "ssd", "the pod's own selector stays");
        assert_eq!(spec.tolerations.as_ref().unwrap().len(), 1);
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["kueue.x-k8s.io/podset"], "main");
        assert_eq!(labels["team"], "x");
        assert_eq!(pod.metadata.annotations.as_ref().unwrap()["note"], "n");
        // Applying twice changes nothing (no duplicate toleration).
        let once = pod.clone();
        placement.apply(&mut pod).unwrap();
        assert_eq!(pod, once);
    }

    #[test]
    fn a_key_given_two_values_is_a_conflict() {
        let flavors = [flavor(json!({"pool": "a"}), json!(null))];
        let updates = [json!({"nodeSelector": {"pool": "b"}})];
        let err = Placement::of(&flavors, &updates, BTreeMap::new()).unwrap_err();
        assert_eq!(err.key, "pool");
        let placement = Placement::of(&flavors, &[], BTreeMap::new()).unwrap();
        let mut pod = Pod {
            spec: Some(PodSpec {
                node_selector: Some([("pool".to_string(), "c".to_string())].into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(placement.apply(&mut pod).is_err());
    }
}
