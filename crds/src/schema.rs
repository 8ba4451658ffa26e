//! Hand-written schema pieces that derive cannot express: list-map conditions, free-form pod templates and the
//! checkpoint claim template.

use schemars::{Schema, SchemaGenerator, json_schema};

/// `metav1.Condition` list as a list-type map keyed on `type`, so server-side apply merges per condition.
pub fn conditions(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "required": ["type", "status", "lastTransitionTime", "reason", "message"],
            "properties": {
                "type": {"type": "string"},
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "observedGeneration": {"type": "integer", "format": "int64"},
                "lastTransitionTime": {"type": "string", "format": "date-time"},
                "reason": {"type": "string"},
                "message": {"type": "string"}
            }
        }
    })
}

/// A PodTemplateSpec kept as an object whose fields the API server does not prune; the operator validates it.
pub fn preserve_unknown_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// A PersistentVolumeClaimSpec kept free-form like the pod template, except `resources.requests`, which is
/// declared so that a CEL rule can see the storage request (CEL cannot read undeclared fields).
pub fn claim_template(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "properties": {
            "resources": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": true,
                "properties": {
                    "requests": {
                        "type": "object",
                        "additionalProperties": {"x-kubernetes-int-or-string": true}
                    }
                }
            }
        }
    })
}
