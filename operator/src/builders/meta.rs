//! What every child of a job carries: its name and namespace, the job's label and the job's controller owner
//! reference (which makes it the job's, as the ownership module judges it).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rdu_crds::consts;

use crate::validate::ValidJob;

/// Labels every child of job `job` carries.
pub(crate) fn job_labels(job: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(consts::LABEL_JOB_NAME.to_string(), job.to_string())])
}

/// Name, namespace, labels and the owner reference of a child of the job.
pub(crate) fn child_meta(job: &ValidJob, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(job.namespace.to_string()),
        labels: Some(job_labels(job.name)),
        owner_references: Some(vec![job.owner.clone()]),
        ..Default::default()
    }
}
