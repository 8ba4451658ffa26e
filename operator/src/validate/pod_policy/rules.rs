//! The rules of the pod policy, each as a Rust check and its CEL twin: Pod Security `restricted` (Windows'
//! hostProcess aside: RDU nodes run Linux, whose kubelet refuses it), then the node, the ServiceAccount, Secrets
//! and the runtime class.

use k8s_openapi::api::core::v1::{PodSpec, SELinuxOptions, SeccompProfile};

use super::{
    Exception, Guard, Rule, account, containers, contexts, pod_context, projections, volumes,
};

/// Sysctls Pod Security deems safe (its baseline list, Kubernetes 1.34).
pub(super) const SAFE_SYSCTLS: [&str; 10] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// SELinux types Pod Security allows (the empty one: unset).
pub(super) const SELINUX_TYPES: [&str; 5] = [
    "",
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// Volume types `restricted` allows, with hostPath and secret, which rules of their own judge.
pub(super) const VOLUME_KEYS: [&str; 10] = [
    "name",
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
    "hostPath",
];

const PRIVILEGED: Guard = Guard::Allow(Exception::Privileged);
const HOST_NAMESPACES: Guard = Guard::Allow(Exception::HostNamespaces);
const SECRETS: Guard = Guard::Allow(Exception::Secrets);

fn unconfined(profile: Option<&SeccompProfile>) -> bool {
    profile.is_some_and(|p| p.type_ == "Unconfined")
}

fn custom_selinux(options: Option<&SELinuxOptions>) -> bool {
    options.is_some_and(|o| {
        !SELINUX_TYPES.contains(&o.type_.as_deref().unwrap_or_default())
            || o.user.as_deref().is_some_and(|u| !u.is_empty())
            || o.role.as_deref().is_some_and(|r| !r.is_empty())
    })
}

fn unconfined_apparmor(spec: &PodSpec, container: bool) -> bool {
    if container {
        contexts(spec).any(|s| {
            s.app_armor_profile
                .as_ref()
                .is_some_and(|p| p.type_ == "Unconfined")
        })
    } else {
        pod_context(spec)
            .and_then(|s| s.app_armor_profile.as_ref())
            .is_some_and(|p| p.type_ == "Unconfined")
    }
}

fn listed(names: &[String], name: &str) -> bool {
    names.iter().any(|n| n == name)
}

/// Every rule, in the order messages are reported.
pub const RULES: &[Rule] = &[
    Rule {
        field: "spec.template.spec.hostNetwork",
        refused: "true",
        guard: HOST_NAMESPACES,
        breaks: |spec, _| spec.host_network == Some(true),
        cel: "!variables.spec.?hostNetwork.orValue(false)",
        example: r#"{"spec": {"hostNetwork": true, "containers": []}}"#,
    },
    Rule {
        field: "spec.template.spec.hostPID",
        refused: "true",
        guard: HOST_NAMESPACES,
        breaks: |spec, _| spec.host_pid == Some(true),
        cel: "!variables.spec.?hostPID.orValue(false)",
        example: r#"{"spec": {"hostPID": true, "containers": []}}"#,
    },
    Rule {
        field: "spec.template.spec.hostIPC",
        refused: "true",
        guard: HOST_NAMESPACES,
        breaks: |spec, _| spec.host_ipc == Some(true),
        cel: "!variables.spec.?hostIPC.orValue(false)",
        example: r#"{"spec": {"hostIPC": true, "containers": []}}"#,
    },
    Rule {
        field: "spec.template.spec.containers[*].ports[*].hostPort",
        refused: "other than 0",
        guard: HOST_NAMESPACES,
        breaks: |spec, _| {
            containers(spec)
                .flat_map(|c| c.ports.iter().flatten())
                .any(|p| p.host_port.is_some_and(|port| port != 0))
        },
        cel: "variables.containers.all(c, c.?ports.orValue([]).all(p, p.?hostPort.orValue(0) == 0))",
        example: r#"{"spec": {"containers": [{"name": "worker", "ports": [{"containerPort": 80, "hostPort": 80}]}]}}"#,
    },
    Rule {
        field: "spec.template.spec.nodeName",
        refused: "set",
        guard: Guard::Allow(Exception::NodeName),
        breaks: |spec, _| spec.node_name.as_deref().is_some_and(|n| !n.is_empty()),
        cel: "variables.spec.?nodeName.orValue('') == ''",
        example: r#"{"spec": {"nodeName": "node-1", "containers": []}}"#,
    },
    Rule {
        field: "spec.template.spec.containers[*].securityContext.privileged",
        refused: "true",
        guard: PRIVILEGED,
        breaks: |spec, _| contexts(spec).any(|s| s.privileged == Some(true)),
        cel: "variables.contexts.all(s, !s.?privileged.orValue(false))",
        example: r#"{"spec": {"containers": [{"name": "worker", "securityContext": {"privileged": true}}]}}"#,
    },
    Rule {
        field: "spec.template.spec.containers[*].securityContext.allowPrivilegeEscalation",
        refused: "true",
        guard: PRIVILEGED,
        breaks: |spec, _| contexts(spec).any(|s| s.allow_privilege_escalation == Some(true)),
        cel: "variables.contexts.all(s, !s.?allowPrivilegeEscalation.orValue(false))",
        example: r#"{"spec": {"containers": [{"name": "worker", "securityContext": {"allowPrivilegeEscalation": true}}]}}"#,
    },
    Rule {
        field: "spec.template.spec.containers[*].securityContext.capabilities.add",
        refused: "other than NET_BIND_SERVICE",
        guard: PRIVILEGED,
        breaks: |spec, _| {
            contexts(spec)
                .filter_map(|s| s.capabilities.as_ref()?.add.as_ref())
                .flatten()
                .any(|c| c != "NET_BIND_SERVICE")
        },
        cel: "variables.contexts.all(s, s.?capabilities.?add.orValue([]).all(c, c == 'NET_BIND_SERVICE'))",
        example: r#"{"spec": {"containers": [{"name": "worker", "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}]}}"#,
    },
    Rule {
        field: "spec.template.spec.containers[*].securityContext.capabilities.drop",
        refused: "without ALL",
        guard: PRIVILEGED,
        breaks: |spec, _| {
            contexts(spec)
                .filter_map(|s| s.capabilities.as_ref()?.drop.as_ref())
                .any(|drop| !drop.iter().any(|c| c == "ALL"))
        },
        cel: "variables.contexts.all(s, s.?capabilities.?drop.orValue(['ALL']).exists(c, c == 'ALL'))",
        example: r#"{"spec": {"containers": [{"name": "worker", "securityContext": {"capabilities": {"drop": []}}}]}}"#,
    },
    Rule {
        field: "spec.template.spec.securityContext.runAsNonRoot",
        refused: "false",
        guard: PRIVILEGED,
        breaks: |spec, _| pod_context(spec).is_some_and(|s| s.run_as_non_root == Some(false)),
        cel: "variables.pod.?runAsNonRoot.orValue(true) != false",
        example: r#"{"spec": {"securityContext": {"runAsNonRoot": false}, "containers": []}}"#,
    },
    Rule {
        field: "spec.template.spec.containers[*].securityContext.runAsNonRoot",
        refused: "false",
        guard: PRIVILEGED,
        breaks: |spec, _| contexts(spec).any(|s| s.run_as_non_root == Some(false)),
        cel: "variables.contexts.all(s, s.?runAsNonRoot.orValue(true) != false)",
        example: r#"{"spec": {"containers": [{"name": "worker", "securityContext": {"runAsNonRoot": false}}]}}"#,
    },
    Rule {
        field: "spec.template.spec.securityContext.runAsUser",
        refused: "0",
        guard: PRIVILEGED,
        breaks: |spec, _| pod_context(spec).is_some_and(|s| s.run_as_user == Some(0)),
        cel: "variables.pod.?runAsUser.orValue(1) != 0",
        example: r#"{"spec": {"securityContext": {"runAsUser": 0}, "containers": []}}"#,
    },
    Rule {
        field: "spec.template.spec.containers[*].securityContext.runAsUser",
        refused: "0",
        guard: PRIVILEGED,
        breaks: |spec, _| contexts(spec).any(|s| s.run_as_user == Some(0)),
        cel: "variables.contexts.all(s, s.?runAsUser.orValue(1) != 0)",
        example: r#"{"spec": {"initContainers": [{"name": "fetch", "securityContext": {"runAsUser": 0}}], "containers": []}}"#,
    },
    Rule {
        field: "spec.template.spec.securityContext.seccompProfile.type",
        refused: "Unconfined",
        guard: PRIVILEGED,
        breaks: |spec, _| pod_context(spec).is_some_and(|s| unconfined(s.seccomp_profile.as_ref())),
        cel: "variables.pod.?seccompProfile.?type.orValue('') != 'Unconfined'",
        example: r#"{"spec": {"securityContext": {"seccompProfile": {"type": "Unconfined"}}, "containers": []}}"#,
    },
    Rule {
        field: "spec.template.spec.containers[*].securityContext.seccompProfile.type",
        refused: "Unconfined",
        guard: PRIVILEGED,
        breaks: |spec, _| contexts(spec).any(|s| unconfined(s.seccomp_profile.as_ref())),
        cel: "variables.contexts.all(s, s.?seccompProfile.?type.orValue('') != 'Unconfined')",
        example: r#"{"spec": {"containers": [{"name": "worker", "securityContext": {"seccompProfile": {"type": "Unconfined"}}}]}}"#,
    },
    Rule {
        field: "spec.template.spec.containers[*].securityContext.procMount",
        refused: "other than Default",
        guard: PRIVILEGED,
        breaks: |spec, _| {
            contexts(spec).any(|s| s.proc_mount.as_deref().is_some_and(|m| m != "Default"))
        },
        cel: "variables.contexts.all(s, s.?procMount.orValue('Default') == 'Default')",
        example: r#"{"spec": {"containers": [{"name": "worker", "securityContext": {"procMount": "Unmasked"}}]}}"#,
    },
    Rule {
        field: "spec.template.spec.securityContext.sysctls[*].name",
        refused: "outside Pod Security's safe set",
        guard: PRIVILEGED,
        breaks: |spec, _| {
            pod_context(spec)
                .and_then(|s| s.sysctls.as_ref())
                .is_some_and(|sysctls| {
                    sysctls
                        .iter()
                        .any(|s| !SAFE_SYSCTLS.contains(&s.name.as_str()))
                })
        },
        cel: "variables.pod.?sysctls.orValue([]).all(s, s.?name.orValue('') in variables.safeSysctls)",
        example: r#"{"spec": {"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]}, "containers": []}}"#,
    },
    Rule {
        field: "spec.template.spec.securityContext.seLinuxOptions",
        refused: "with a type other than a container's, a user or a role",
        guard: PRIVILEGED,
        breaks: |spec, _| {
            pod_context(spec).is_some_and(|s| custom_selinux(s.se_linux_options.as_ref()))
        },
        cel: "variables.pod.?seLinuxOptions.?type.orValue('') in variables.seLinuxTypes && \
              variables.pod.?seLinuxOptions.?user.orValue('') == '' && \
              variables.pod.?seLinuxOptions.?role.orValue('') == ''",
        example: r#"{"spec": {"securityContext": {"seLinuxOptions": {"type": "spc_t"}}, "containers": []}}"#,
    },
    Rule {
        field: "spec.template.spec.containers[*].securityContext.seLinuxOptions",
        refused: "with a type other than a container's, a user or a role",
        guard: PRIVILEGED,
        breaks: |spec, _| contexts(spec).any(|s| custom_selinux(s.se_linux_options.as_ref())),
        cel: "variables.contexts.all(s, s.?seLinuxOptions.?type.orValue('') in variables.seLinuxTypes && \
              s.?seLinuxOptions.?user.orValue('') == '' && s.?seLinuxOptions.?role.orValue('') == '')",
        example: r#"{"spec": {"containers": [{"name": "worker", "securityContext": {"seLinuxOptions": {"user": "system_u"}}}]}}"#,
    },
    Rule {
        field: "spec.template.spec.securityContext.appArmorProfile.type",
        refused: "Unconfined",
        guard: PRIVILEGED,
        breaks: |spec, _| unconfined_apparmor(spec, false),
        cel: "variables.pod.?appArmorProfile.?type.orValue('') != 'Unconfined'",
        example: r#"{"spec": {"securityContext": {"appArmorProfile": {"type": "Unconfined"}}, "containers": []}}"#,
    },
    Rule {
        field: "spec.template.spec.containers[*].securityContext.appArmorProfile.type",
        refused: "Unconfined",
        guard: PRIVILEGED,
        breaks: |spec, _| unconfined_apparmor(spec, true),
        cel: "variables.contexts.all(s, s.?appArmorProfile.?type.orValue('') != 'Unconfined')",
        example: r#"{"spec": {"containers": [{"name": "worker", "securityContext": {"appArmorProfile": {"type": "Unconfined"}}}]}}"#,
    },
    Rule {
        field: "spec.template.spec.volumes[*].hostPath",
        refused: "set",
        guard: Guard::Allow(Exception::HostPath),
        breaks: |spec, _| volumes(spec).any(|v| v.host_path.is_some()),
        cel: "variables.volumes.all(v, !has(v.hostPath))",
        example: r#"{"spec": {"volumes": [{"name": "host", "hostPath": {"path": "/"}}], "containers": []}}"#,
    },
    Rule {
        field: "spec.template.spec.volumes[*]",
        refused: "of a type Pod Security restricted refuses (it allows configMap, csi, downwardAPI, emptyDir, \
                  ephemeral, persistentVolumeClaim, projected and secret)",
        guard: PRIVILEGED,
        breaks: |spec, _| {
            volumes(spec).any(|v| {
                serde_json::to_value(v)
                    .ok()
                    .and_then(|v| v.as_object().cloned())
                    .is_some_and(|keys| keys.keys().any(|k| !VOLUME_KEYS.contains(&k.as_str())))
            })
        },
        cel: "variables.volumes.all(v, v.all(k, k in variables.volumeKeys))",
        example: r#"{"spec": {"volumes": [{"name": "nfs", "nfs": {"server": "nfs.example", "path": "/"}}], "containers": []}}"#,
    },
    Rule {
        field: "spec.template.spec.volumes[*].secret",
        refused: "set",
        guard: SECRETS,
        breaks: |spec, _| volumes(spec).any(|v| v.secret.is_some()),
        cel: "variables.volumes.all(v, !has(v.secret))",
        example: r#"{"spec": {"volumes": [{"name": "keys", "secret": {"secretName": "keys"}}], "containers": []}}"#,
    },
    Rule {
        field: "spec.template.spec.volumes[*].projected.sources[*].secret",
        refused: "set",
        guard: SECRETS,
        breaks: |spec, _| projections(spec).any(|p| p.secret.is_some()),
        cel: "variables.volumes.all(v, v.?projected.?sources.orValue([]).all(s, !has(s.secret)))",
        example: r#"{"spec": {"volumes": [{"name": "all", "projected": {"sources": [{"secret": {"name": "keys"}}]}}], "containers": []}}"#,
    },
    Rule {
        field: "spec.template.spec.containers[*].env[*].valueFrom.secretKeyRef",
        refused: "set",
        guard: SECRETS,
        breaks: |spec, _| {
            containers(spec)
                .flat_map(|c| c.env.iter().flatten())
                .any(|e| {
                    e.value_from
                        .as_ref()
                        .is_some_and(|f| f.secret_key_ref.is_some())
                })
        },
        cel: "variables.containers.all(c, c.?env.orValue([]).all(e, !has(e.valueFrom) || \
              !has(e.valueFrom.secretKeyRef)))",
        example: r#"{"spec": {"containers": [{"name": "worker", "env": [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "keys", "key": "k"}}}]}]}}"#,
    },
    Rule {
        field: "spec.template.spec.containers[*].envFrom[*].secretRef",
        refused: "set",
        guard: SECRETS,
        breaks: |spec, _| {
            containers(spec)
                .flat_map(|c| c.env_from.iter().flatten())
                .any(|e| e.secret_ref.is_some())
        },
        cel: "variables.containers.all(c, c.?envFrom.orValue([]).all(e, !has(e.secretRef)))",
        example: r#"{"spec": {"containers": [{"name": "worker", "envFrom": [{"secretRef": {"name": "keys"}}]}]}}"#,
    },
    Rule {
        field: "spec.template.spec.serviceAccountName",
        refused: "other than default",
        guard: Guard::ServiceAccount,
        breaks: |spec, policy| {
            let name = account(spec);
            name != "default" && !listed(&policy.service_accounts, name)
        },
        cel: "variables.account == 'default' || variables.account in variables.serviceAccounts",
        example: r#"{"spec": {"serviceAccountName": "trainer", "containers": []}}"#,
    },
    Rule {
        field: "spec.template.spec.automountServiceAccountToken",
        refused: "true",
        guard: Guard::ServiceAccount,
        breaks: |spec, policy| {
            spec.automount_service_account_token == Some(true)
                && !listed(&policy.service_accounts, account(spec))
        },
        cel: "!variables.spec.?automountServiceAccountToken.orValue(false) || \
              variables.account in variables.serviceAccounts",
        example: r#"{"spec": {"automountServiceAccountToken": true, "containers": []}}"#,
    },
    Rule {
        field: "spec.template.spec.volumes[*].projected.sources[*].serviceAccountToken",
        refused: "set",
        guard: Guard::ServiceAccount,
        breaks: |spec, policy| {
            projections(spec).any(|p| p.service_account_token.is_some())
                && !listed(&policy.service_accounts, account(spec))
        },
        cel: "variables.volumes.all(v, v.?projected.?sources.orValue([]).all(s, !has(s.serviceAccountToken))) || \
              variables.account in variables.serviceAccounts",
        example: r#"{"spec": {"volumes": [{"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}], "containers": []}}"#,
    },
    Rule {
        field: "spec.template.spec.runtimeClassName",
        refused: "not listed by the cluster admin",
        guard: Guard::RuntimeClass,
        breaks: |spec, policy| {
            spec.runtime_class_name
                .as_deref()
                .is_some_and(|c| !c.is_empty() && !listed(&policy.runtime_classes, c))
        },
        cel: "variables.spec.?runtimeClassName.orValue('') == '' || \
              variables.spec.runtimeClassName in variables.runtimeClasses",
        example: r#"{"spec": {"runtimeClassName": "kata", "containers": []}}"#,
    },
];
