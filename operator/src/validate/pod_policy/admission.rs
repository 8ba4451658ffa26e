//! The chart's ValidatingAdmissionPolicy for the pod policy, generated from the rules so that the API server
//! and the operator refuse the same templates with the same messages.

use super::rules::{SAFE_SYSCTLS, SELINUX_TYPES, VOLUME_KEYS};
use super::{Guard, RULES};

/// Where the generated template lives, from the workspace root.
#[cfg(test)]
const TEMPLATE_PATH: &str = "charts/rdu-operator/templates/rdujob-pod-policy.yaml";

/// CEL variables the rules read (see [`super::Rule::cel`]), in the order they are defined.
const VARIABLES: [(&str, &str); 6] = [
    ("spec", "object.spec.?template.?spec.orValue({})"),
    (
        "containers",
        "variables.spec.?containers.orValue([]) + variables.spec.?initContainers.orValue([])",
    ),
    (
        "contexts",
        "variables.containers.map(c, c.?securityContext.orValue({}))",
    ),
    ("pod", "variables.spec.?securityContext.orValue({})"),
    ("volumes", "variables.spec.?volumes.orValue([])"),
    (
        "account",
        "variables.spec.?serviceAccountName.orValue('') != '' ? variables.spec.serviceAccountName : \
         (variables.spec.?serviceAccount.orValue('') != '' ? variables.spec.serviceAccount : 'default')",
    ),
];

/// The Helm template of the policy and its binding: each rule a validation, left out when the chart value
/// that allows its exception is true; the admin's lists rendered as CEL lists.
pub(crate) fn admission_policy_yaml() -> String {
    let mut out = String::from(HEADER);
    for (name, expression) in VARIABLES {
        out += &format!("    - name: {name}\n      expression: \"{expression}\"\n");
    }
    // The lists the Rust checks read, written once there.
    for (name, list) in [
        ("safeSysctls", &SAFE_SYSCTLS[..]),
        ("seLinuxTypes", &SELINUX_TYPES[..]),
        ("volumeKeys", &VOLUME_KEYS[..]),
    ] {
        out += &format!(
            "    - name: {name}\n      expression: \"{}\"\n",
            cel_list(list)
        );
    }
    out += "    - name: serviceAccounts\n      expression: {{ toJson .Values.podPolicy.serviceAccounts | quote }}\n";
    out += "    - name: runtimeClasses\n      expression: {{ toJson .Values.podPolicy.runtimeClasses | quote }}\n";
    out += "  validations:\n";
    for rule in RULES {
        let validation = format!(
            "    - expression: \"{}\"\n      message: \"{}\"\n      reason: Forbidden\n",
            rule.cel,
            rule.message()
        );
        match rule.guard {
            Guard::Allow(exception) => {
                out += &format!("    {{{{- if not $allow.{} }}}}\n", exception.key());
                out += &validation;
                out += "    {{- end }}\n";
            }
            Guard::ServiceAccount | Guard::RuntimeClass => out += &validation,
        }
    }
    out += BINDING;
    out
}

/// A CEL list of string literals.
fn cel_list(items: &[&str]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("'{i}'")).collect();
    format!("[{}]", quoted.join(", "))
}

const HEADER: &str = r#"{{- /*
Generated from operator/src/validate/pod_policy/rules.rs: edit the rules there, then run
`RDU_REGENERATE=1 cargo test -p rdu-operator --lib pod_policy` to rewrite this file.
*/ -}}
{{- if .Values.podPolicy.admission }}
{{- $allow := .Values.podPolicy.allow }}
# The cluster admin's pod policy for rank pods (DESIGN 9), at the API: `kubectl apply` refuses an RduJob whose
# spec.template gives its pods what the policy does not allow, with the message the operator would give.
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ include "rdu-operator.fullname" . }}-pod-policy
  labels:
    {{- include "rdu-operator.labels" . | nindent 4 }}
    app.kubernetes.io/component: operator
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: ["rdu.dev"]
        apiVersions: ["*"]
        operations: ["CREATE", "UPDATE"]
        resources: ["rdujobs"]
  matchConditions:
    # An update that leaves the template alone (the operator's own writes, a change of workers) is not judged
    # again: a job admitted before the policy changed keeps running as it was.
    - name: template-set-or-changed
      expression: "request.operation == 'CREATE' || object.spec.?template.orValue({}) != oldObject.spec.?template.orValue({})"
  variables:
"#;

const BINDING: &str = r#"---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ include "rdu-operator.fullname" . }}-pod-policy
  labels:
    {{- include "rdu-operator.labels" . | nindent 4 }}
    app.kubernetes.io/component: operator
spec:
  policyName: {{ include "rdu-operator.fullname" . }}-pod-policy
  validationActions: [Deny]
  {{- with .Values.operator.watchNamespace }}
  matchResources:
    namespaceSelector:
      matchLabels:
        kubernetes.io/metadata.name: {{ . }}
  {{- end }}
{{- end }}
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::pod_policy::Exception;
    use clap::ValueEnum;
    use std::path::PathBuf;

    fn root() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    #[test]
    fn the_charts_pod_policy_is_generated_from_the_rules() {
        let path = root().join(TEMPLATE_PATH);
        let generated = admission_policy_yaml();
        if std::env::var_os("RDU_REGENERATE").is_some() {
            std::fs::write(&path, &generated).expect("write the template");
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "{TEMPLATE_PATH} is stale: run `RDU_REGENERATE=1 cargo test -p rdu-operator --lib pod_policy` and \
             commit the result"
        );
    }

    #[test]
    fn every_exception_and_list_is_a_chart_value_off_by_default() {
        let values: serde_yaml_ng::Value = serde_yaml_ng::from_str(
            &std::fs::read_to_string(root().join("charts/rdu-operator/values.yaml"))
                .expect("values"),
        )
        .expect("yaml");
        let policy = &values["podPolicy"];
        for exception in Exception::value_variants() {
            assert_eq!(
                policy["allow"][exception.key()].as_bool(),
                Some(false),
                "podPolicy.allow.{}",
                exception.key()
            );
        }
        for list in ["serviceAccounts", "runtimeClasses"] {
            assert_eq!(
                policy[list].as_sequence().map(Vec::len),
                Some(0),
                "podPolicy.{list}"
            );
        }
        assert_eq!(policy["admission"].as_bool(), Some(true));
    }

    #[test]
    fn messages_and_cel_fit_in_double_quoted_yaml() {
        for rule in RULES {
            for text in [rule.cel.to_string(), rule.message()] {
                assert!(
                    !text.contains(['"', '\\']) && !text.contains("{{"),
                    "{text}"
                );
            }
        }
    }
}
