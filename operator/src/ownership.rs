//! Whose an object named like a job's child is. A job's own children carry its controller owner reference (the
//! job's UID with `controller: true`); the operator counts, keeps and deletes only those. An object of a child's
//! name that something else controls (or nothing does) is never adopted, changed or deleted: the job fails with a
//! [`ChildConflict`] instead. What an earlier job of the same name left for the garbage collector, or anything being
//! deleted, is waited for, so a job deleted and applied again starts once the old children are gone.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use rdu_crds::consts;

/// The job a child must belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct JobIdentity<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
}

/// What an existing object of a child's name is to the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Ownership {
    /// The job controls it.
    Ours,
    /// It is going away: being deleted, or controlled by an earlier RduJob of the same name (deleted, so the
    /// garbage collector removes it). Wait for it to go.
    Leaving,
    /// Someone else's: the job must not touch it.
    Foreign(ChildConflict),
}

/// An object the job needs to create exists and is not the job's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) struct ChildConflict {
    /// Its kind (`Service`, `Secret`, `Pod`...).
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    /// Its controller as `<Kind> <name>` (an RduJob of another UID is still named), none when it has none.
    pub controller: Option<String>,
}

impl fmt::Display for ChildConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whose = match &self.controller {
            Some(controller) => format!("it is controlled by {controller}"),
            None => "it has no controller".to_string(),
        };
        write!(
            f,
            "{} {}/{} already exists and is not this job's ({whose}); the job leaves it as it is: delete or \
             rename the existing object, or rename the job",
            self.kind, self.namespace, self.name
        )
    }
}

/// The controller owner reference of an object, if any.
pub(crate) fn controller(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// Whether the object's controller is the object with this UID.
pub(crate) fn controlled_by(meta: &ObjectMeta, uid: &str) -> bool {
    controller(meta).is_some_and(|r| r.uid == uid)
}

/// What the existing object of kind `kind` described by `meta` is to `job`.
pub(crate) fn ownership(kind: &'static str, meta: &ObjectMeta, job: JobIdentity) -> Ownership {
    let owner = controller(meta);
    if owner.is_some_and(|r| r.uid == job.uid) && meta.deletion_timestamp.is_none() {
        return Ownership::Ours;
    }
    let earlier_job_of_this_name = owner.is_some_and(|r| {
        r.kind == "RduJob"
            && r.api_version.split('/').next() == Some(consts::GROUP)
            && r.name == job.name
    });
    if meta.deletion_timestamp.is_some() || earlier_job_of_this_name {
        return Ownership::Leaving;
    }
    Ownership::Foreign(ChildConflict {
        kind,
        namespace: meta
            .namespace
            .clone()
            .unwrap_or_else(|| job.namespace.to_string()),
        name: meta.name.clone().unwrap_or_default(),
        controller: owner.map(|r| format!("{} {}", r.kind, r.name)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const JOB: JobIdentity = JobIdentity {
        namespace: "ml",
        name: "mnist",
        uid: "u-now",
    };

    fn owner(
        api_version: &str,
        kind: &str,
        name: &str,
        uid: &str,
        controller: bool,
    ) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(controller),
            block_owner_deletion: None,
        }
    }

    fn meta(owners: Vec<OwnerReference>, deleting: bool) -> ObjectMeta {
        ObjectMeta {
            name: Some("mnist".into()),
            namespace: Some("ml".into()),
            owner_references: (!owners.is_empty()).then_some(owners),
            deletion_timestamp: deleting.then_some(Time(jiff::Timestamp::UNIX_EPOCH)),
            ..Default::default()
        }
    }

    fn conflict(controller: Option<&str>) -> Ownership {
        Ownership::Foreign(ChildConflict {
            kind: "Service",
            namespace: "ml".into(),
            name: "mnist".into(),
            controller: controller.map(String::from),
        })
    }

    #[test]
    fn only_the_jobs_own_controller_reference_makes_a_child_ours() {
        let this = || owner("rdu.dev/v1alpha1", "RduJob", "mnist", "u-now", true);
        let cases = [
            (
                "controlled by this job",
                meta(vec![this()], false),
                Ownership::Ours,
            ),
            ("no owner at all", meta(vec![], false), conflict(None)),
            (
                "this job only as a non-controlling owner",
                meta(
                    vec![owner("rdu.dev/v1alpha1", "RduJob", "mnist", "u-now", false)],
                    false,
                ),
                conflict(None),
            ),
            (
                "another kind of controller",
                meta(
                    vec![owner("apps/v1", "Deployment", "web", "u-web", true)],
                    false,
                ),
                conflict(Some("Deployment web")),
            ),
            (
                "another RduJob",
                meta(
                    vec![owner("rdu.dev/v1alpha1", "RduJob", "other", "u-o", true)],
                    false,
                ),
                conflict(Some("RduJob other")),
            ),
            (
                "a job of the same name but another group",
                meta(
                    vec![owner("example.com/v1", "RduJob", "mnist", "u-x", true)],
                    false,
                ),
                conflict(Some("RduJob mnist")),
            ),
            (
                "an earlier RduJob of this name, awaiting garbage collection",
                meta(
                    vec![owner("rdu.dev/v1alpha1", "RduJob", "mnist", "u-old", true)],
                    false,
                ),
                Ownership::Leaving,
            ),
            (
                "someone else's, being deleted",
                meta(vec![], true),
                Ownership::Leaving,
            ),
            (
                "ours, being deleted",
                meta(vec![this()], true),
                Ownership::Leaving,
            ),
        ];
        for (case, meta, want) in cases {
            assert_eq!(ownership("Service", &meta, JOB), want, "{case}");
        }
    }

    #[test]
    fn a_conflict_names_the_object_its_controller_and_the_fix() {
        let Ownership::Foreign(conflict) = conflict(Some("Deployment web")) else {
            unreachable!()
        };
        assert_eq!(
            conflict.to_string(),
            "Service ml/mnist already exists and is not this job's (it is controlled by Deployment web); the job \
             leaves it as it is: delete or rename the existing object, or rename the job"
        );
    }

    #[test]
    fn controlled_by_reads_the_controller_reference_only() {
        let m = meta(
            vec![
                owner("v1", "ConfigMap", "x", "u-now", false),
                owner("rdu.dev/v1alpha1", "RduJob", "mnist", "u-2", true),
            ],
            false,
        );
        assert!(controlled_by(&m, "u-2"));
        assert!(
            !controlled_by(&m, "u-now"),
            "a non-controlling owner does not count"
        );
        assert!(!controlled_by(&meta(vec![], false), "u-2"));
    }
}
