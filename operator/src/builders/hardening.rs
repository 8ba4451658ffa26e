//! Every rank's pod meets the restricted Pod Security profile by default: no ServiceAccount token mounted (the
//! worker never calls the API; rank 0's progress token is a projected volume of its own), non-root, the runtime's
//! seccomp profile, and in every container no privilege escalation, every capability dropped and a read-only
//! root filesystem (the worker writes only to mounted volumes and `/dev/termination-log`; its shared-memory rings
//! are anonymous memory, no file).
//! `spec.template` may loosen any of these by stating the field where the cluster admin's pod policy allows it
//! (`validate::pod_policy`, checked before any builder runs): a stated field is kept as it is.

use k8s_openapi::api::core::v1::{Container, PodSpec, SeccompProfile};

/// The seccomp profile every rank gets unless the template states one.
pub(crate) const SECCOMP_PROFILE: &str = "RuntimeDefault";

/// Fills in the restricted profile's fields that `spec` (the merged template) leaves unset.
pub(crate) fn harden(spec: &mut PodSpec) {
    spec.automount_service_account_token.get_or_insert(false);
    let pod = spec.security_context.get_or_insert_with(Default::default);
    // A template that names uid 0 asked for root: adding runAsNonRoot would only make the kubelet refuse it.
    if pod.run_as_non_root.is_none() && pod.run_as_user != Some(0) {
        pod.run_as_non_root = Some(true);
    }
    pod.seccomp_profile.get_or_insert_with(|| SeccompProfile {
        type_: SECCOMP_PROFILE.to_string(),
        localhost_profile: None,
    });
    let init = spec.init_containers.iter_mut().flatten();
    for container in spec.containers.iter_mut().chain(init) {
        harden_container(container);
    }
}

fn harden_container(container: &mut Container) {
    let context = container
        .security_context
        .get_or_insert_with(Default::default);
    let capabilities = context.capabilities.get_or_insert_with(Default::default);
    capabilities
        .drop
        .get_or_insert_with(|| vec!["ALL".to_string()]);
    let adds_sys_admin = capabilities
        .add
        .iter()
        .flatten()
        .any(|c| c == "SYS_ADMIN" || c == "CAP_SYS_ADMIN");
    // The API refuses allowPrivilegeEscalation false beside privileged or CAP_SYS_ADMIN, which imply it.
    if context.privileged != Some(true) && !adds_sys_admin {
        context.allow_privilege_escalation.get_or_insert(false);
    }
    context.read_only_root_filesystem.get_or_insert(true);
    if context.run_as_user == Some(0) && context.run_as_non_root.is_none() {
        context.run_as_non_root = Some(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Capabilities, PodSecurityContext, SecurityContext};
    use serde_json::json;

    fn spec(value: serde_json::Value) -> PodSpec {
        let mut spec: PodSpec = serde_json::from_value(value).expect("pod spec");
        harden(&mut spec);
        spec
    }

    fn context(spec: &PodSpec, container: usize) -> SecurityContext {
        spec.containers[container]
            .security_context
            .clone()
            .expect("security context")
    }

    #[test]
    fn a_pod_that_states_nothing_gets_the_restricted_profile() {
        let spec = spec(json!({
            "containers": [{"name": "worker"}, {"name": "sidecar"}],
            "initContainers": [{"name": "fetch"}]
        }));
        assert_eq!(spec.automount_service_account_token, Some(false));
        let pod = spec.security_context.clone().expect("pod context");
        assert_eq!(
            pod,
            PodSecurityContext {
                run_as_non_root: Some(true),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    localhost_profile: None
                }),
                ..Default::default()
            }
        );
        let restricted = SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                add: None,
                drop: Some(vec!["ALL".into()]),
            }),
            ..Default::default()
        };
        assert_eq!(context(&spec, 0), restricted);
        assert_eq!(context(&spec, 1), restricted, "a template's sidecar too");
        let init = spec.init_containers.as_ref().expect("init")[0]
            .security_context
            .clone();
        assert_eq!(init, Some(restricted), "and its init containers");
    }

    #[test]
    fn a_template_loosens_exactly_what_it_states() {
        let spec = spec(json!({
            "automountServiceAccountToken": true,
            "securityContext": {"runAsNonRoot": false, "seccompProfile": {"type": "Unconfined"}},
            "containers": [{"name": "worker", "securityContext": {
                "allowPrivilegeEscalation": true,
                "readOnlyRootFilesystem": false,
                "capabilities": {"add": ["NET_ADMIN"], "drop": []}
            }}, {"name": "sidecar", "securityContext": {"capabilities": {"add": ["NET_RAW"]}}}]
        }));
        assert_eq!(spec.automount_service_account_token, Some(true));
        let pod = spec.security_context.clone().expect("pod context");
        assert_eq!(pod.run_as_non_root, Some(false));
        assert_eq!(
            pod.seccomp_profile.map(|p| p.type_).as_deref(),
            Some("Unconfined")
        );
        let worker = context(&spec, 0);
        assert_eq!(worker.allow_privilege_escalation, Some(true));
        assert_eq!(worker.read_only_root_filesystem, Some(false));
        assert_eq!(
            worker.capabilities,
            Some(Capabilities {
                add: Some(vec!["NET_ADMIN".into()]),
                drop: Some(vec![])
            })
        );
        let sidecar = context(&spec, 1);
        assert_eq!(
            sidecar.capabilities,
            Some(Capabilities {
                add: Some(vec!["NET_RAW".into()]),
                drop: Some(vec!["ALL".into()])
            }),
            "an add without a drop still drops the rest"
        );
        assert_eq!(sidecar.read_only_root_filesystem, Some(true));
    }

    #[test]
    fn stated_root_and_privilege_are_not_contradicted() {
        let spec = spec(json!({
            "securityContext": {"runAsUser": 0},
            "containers": [
                {"name": "worker", "securityContext": {"privileged": true}},
                {"name": "mounter", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}},
                {"name": "root", "securityContext": {"runAsUser": 0}}
            ]
        }));
        let pod = spec.security_context.clone().expect("pod context");
        assert_eq!(pod.run_as_non_root, None, "the pod asked for uid 0");
        assert_eq!(context(&spec, 0).allow_privilege_escalation, None);
        assert_eq!(context(&spec, 1).allow_privilege_escalation, None);
        let root = context(&spec, 2);
        assert_eq!(root.run_as_non_root, Some(false));
        assert_eq!(root.allow_privilege_escalation, Some(false));
    }
}
