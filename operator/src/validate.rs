//! Validation of an RduJob before anything is built: the CRD's schema and CEL rules (shared with local mode and the
//! worker through `rdu_crds::validate_spec`), plus what only the operator checks (names that must fit a DNS label,
//! the checkpoint volume in the template). Every message names the field and the fix.

use std::fmt;

use rdu_crds::{FieldError, RduJob, validation::Checks};

/// Every rule a job breaks (never empty when returned as an error).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let messages: Vec<&str> = self.0.iter().map(|e| e.message.as_str()).collect();
        write!(f, "invalid RduJob: {}", messages.join("; "))
    }
}

/// Longest pod name usable as a hostname (a DNS-1123 label).
const MAX_LABEL: usize = 63;

/// Checks every rule of the CRD's schema and CEL, and the operator's own; collects all failures.
pub fn validate(job: &RduJob) -> Result<(), ValidationErrors> {
    let mut own = Checks::default();
    check_name(&mut own, job);
    check_checkpoint_volume(&mut own, job);
    let mut errors = own.finish().err().unwrap_or_default();
    errors.extend(rdu_crds::validate_spec(&job.spec).err().unwrap_or_default());
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors(errors))
    }
}

/// The name becomes the Service name and, with the rank, every pod's hostname.
fn check_name(c: &mut Checks, job: &RduJob) {
    let name = job.metadata.name.as_deref().unwrap_or_default();
    c.check(!name.is_empty(), "metadata.name", || {
        "metadata.name is required: name the job".into()
    });
    if !name.is_empty() {
        let longest_pod = rdu_crds::consts::pod_name(name, job.spec.workers.saturating_sub(1));
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
    let Some(volume) = spec.checkpoint.as_ref().and_then(|k| k.volume.as_ref()) else {
        return;
    };
    let declared = spec
        .template
        .as_ref()
        .and_then(|t| t.spec.as_ref())
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|vs| vs.iter().any(|v| &v.name == volume));
    c.check(declared, "spec.checkpoint.volume", || {
        format!(
            "spec.checkpoint.volume {volume:?} is not a volume of spec.template.spec.volumes: add it there or omit \
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
    use crate::builders::test_fixtures::job;
    use rdu_crds::DataSource;

    fn fields(job: &RduJob) -> Vec<String> {
        match validate(job) {
            Ok(()) => vec![],
            Err(e) => e.0.into_iter().map(|e| e.field).collect(),
        }
    }

    #[test]
    fn fixture_is_valid() {
        assert_eq!(validate(&job("mnist", Some("ml"), 4)), Ok(()));
    }

    #[test]
    fn each_rule_names_its_field() {
        type Breaker = fn(&mut RduJob);
        // The spec's rules have their own table in rdu-crds; two of them show they are applied here too.
        let cases: Vec<(Breaker, &str)> = vec![
            (|j| j.spec.workers = 0, "spec.workers"),
            (|j| j.spec.data.source = DataSource::Csv, "spec.data.path"),
            (
                |j| {
                    j.spec.checkpoint = Some(rdu_crds::CheckpointSpec {
                        interval_steps: 5,
                        volume: Some("ckpt".into()),
                        volume_claim_template: None,
                        keep: 1,
                    })
                },
                "spec.checkpoint.volume",
            ),
            (|j| j.metadata.name = None, "metadata.name"),
            (|j| j.metadata.name = Some("Mnist".into()), "metadata.name"),
            (|j| j.metadata.name = Some("a".repeat(60)), "metadata.name"),
        ];
        for (i, (breaker, field)) in cases.into_iter().enumerate() {
            let mut j = job("mnist", Some("ml"), 4);
            breaker(&mut j);
            assert_eq!(fields(&j), vec![field.to_string()], "case {i}");
        }
    }

    #[test]
    fn all_failures_are_reported_and_messages_name_fields() {
        let mut j = job("mnist", None, 4);
        j.spec.workers = 0;
        j.spec.tiles_per_worker = 5;
        let err = validate(&j).expect_err("invalid");
        assert_eq!(err.0.len(), 2);
        let text = err.to_string();
        assert!(text.contains("spec.workers must be at least 1"), "{text}");
        assert!(
            text.contains("spec.tilesPerWorker must be 1, 2, 4 or 8 (got 5)"),
            "{text}"
        );
    }

    #[test]
    fn checkpoint_volume_declared_in_template_is_accepted() {
        let mut j = job("mnist", None, 2);
        j.spec.template = Some(
            serde_json::from_value(serde_json::json!({
                "spec": {"containers": [], "volumes": [{"name": "ckpt", "emptyDir": {}}]}
            }))
            .expect("template"),
        );
        j.spec.checkpoint = Some(rdu_crds::CheckpointSpec {
            interval_steps: 5,
            volume: Some("ckpt".into()),
            volume_claim_template: None,
            keep: 1,
        });
        assert_eq!(validate(&j), Ok(()));
    }
}
