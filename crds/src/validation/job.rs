//! The rules on the whole job beyond its spec: a name that fits a DNS label with the longest pod name, and a
//! checkpoint volume the pod template declares. The operator and local mode both apply them.

use super::{Checks, FieldError};
use crate::{RduJob, consts};

/// Longest pod name usable as a hostname (a DNS-1123 label).
const MAX_LABEL: usize = 63;

/// Every rule of the CRD's schema and CEL, and the rules on the job's name and template; collects all failures.
pub fn validate_job(job: &RduJob) -> Result<(), Vec<FieldError>> {
    let mut own = Checks::default();
    check_name(&mut own, job);
    check_checkpoint_volume(&mut own, job);
    let mut errors = own.finish().err().unwrap_or_default();
    errors.extend(super::validate_spec(&job.spec).err().unwrap_or_default());
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// The name becomes the Service name and, with the rank, every pod's hostname.
fn check_name(c: &mut Checks, job: &RduJob) {
    let name = job.metadata.name.as_deref().unwrap_or_default();
    c.check(!name.is_empty(), "metadata.name", || {
        "metadata.name is required: name the job".into()
    });
    if !name.is_empty() {
        let longest_pod = consts::pod_name(name, job.spec.workers.saturating_sub(1));
        c.check(
            is_dns_label(name) && longest_pod.len() <= MAX_LABEL,
            "metadata.name",
            || {
                format!(
                    "metadata.name {name:?} must be lowercase letters, digits and '-', start with a letter, and \
                     short enough that pod {longest_pod:?} has at most {MAX_LABEL} characters: use a shorter name"
                )
            },
        );
    }
}

/// A named checkpoint volume must be one the pod template declares.
fn check_checkpoint_volume(c: &mut Checks, job: &RduJob) {
    let spec = &job.spec;
    if let Some(volume) = spec.checkpoint.as_ref().and_then(|k| k.volume.as_ref()) {
        check_declared(c, job, "spec.checkpoint.volume", volume);
    }
    if let Some(volume) = spec.tensorboard.as_ref().and_then(|t| t.volume.as_ref()) {
        check_declared(c, job, "spec.tensorboard.volume", volume);
    }
}

/// `field` names `volume`, which must be one of the pod template's volumes.
fn check_declared(c: &mut Checks, job: &RduJob, field: &'static str, volume: &str) {
    let declared = job
        .spec
        .template
        .as_ref()
        .and_then(|t| t.spec.as_ref())
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|vs| vs.iter().any(|v| v.name == volume));
    c.check(declared, field, || {
        format!(
            "{field} {volume:?} is not a volume of spec.template.spec.volumes: add it there or omit \
             the field for an emptyDir"
        )
    });
}

/// RFC 1035 label: what a Service name and a pod's subdomain must be.
fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_LABEL
        && bytes[0].is_ascii_lowercase()
        && bytes[bytes.len() - 1] != b'-'
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CheckpointSpec, DataSource};

    fn job() -> RduJob {
        crate::parse_manifest(
            "apiVersion: rdu.dev/v1alpha1\nkind: RduJob\nmetadata: {name: mnist, namespace: ml}\nspec:\n  workers: 4\n  model: {name: ffn-logreg}\n  data: {source: synthetic}\n  training: {epochs: 1, batchSize: 8, learningRate: 0.1}\n",
        )
        .expect("fixture")
    }

    fn fields(job: &RduJob) -> Vec<String> {
        validate_job(job)
            .err()
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.field)
            .collect()
    }

    fn checkpoint_in(volume: &str) -> Option<CheckpointSpec> {
        Some(CheckpointSpec {
            interval_steps: 5,
            volume: Some(volume.into()),
            volume_claim_template: None,
            keep: 1,
        })
    }

    #[test]
    fn each_rule_names_its_field() {
        type Breaker = fn(&mut RduJob);
        // The spec's rules have their own table; two of them show they are applied here too.
        let cases: Vec<(Breaker, &str)> = vec![
            (|j| j.spec.workers = 0, "spec.workers"),
            (|j| j.spec.data.source = DataSource::Csv, "spec.data.path"),
            (
                |j| j.spec.checkpoint = checkpoint_in("ckpt"),
                "spec.checkpoint.volume",
            ),
            (
                |j| {
                    j.spec.tensorboard = Some(crate::TensorBoardSpec {
                        volume: Some("logs".into()),
                    })
                },
                "spec.tensorboard.volume",
            ),
            (|j| j.metadata.name = None, "metadata.name"),
            (|j| j.metadata.name = Some("Mnist".into()), "metadata.name"),
            (|j| j.metadata.name = Some("a".repeat(60)), "metadata.name"),
        ];
        assert_eq!(fields(&job()), Vec::<String>::new());
        for (i, (breaker, field)) in cases.into_iter().enumerate() {
            let mut j = job();
            breaker(&mut j);
            assert_eq!(fields(&j), vec![field.to_string()], "case {i}");
        }
    }

    #[test]
    fn all_failures_are_reported_and_messages_name_fields() {
        let mut j = job();
        j.spec.workers = 0;
        j.spec.tiles_per_worker = 5;
        let errors = validate_job(&j).expect_err("invalid");
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 2);
        assert!(
            text[0].contains("spec.workers must be at least 1"),
            "{text:?}"
        );
        assert!(
            text[1].contains("spec.tilesPerWorker must be 1, 2, 4 or 8 (got 5)"),
            "{text:?}"
        );
    }

    #[test]
    fn a_checkpoint_volume_declared_in_the_template_is_accepted() {
        let mut j = job();
        j.spec.template = Some(
            serde_json::from_value(serde_json::json!({
                "spec": {"containers": [], "volumes": [{"name": "ckpt", "emptyDir": {}}]}
            }))
            .expect("template"),
        );
        j.spec.checkpoint = checkpoint_in("ckpt");
        j.spec.tensorboard = Some(crate::TensorBoardSpec {
            volume: Some("ckpt".into()),
        });
        assert_eq!(validate_job(&j), Ok(()));
    }
}
