{{/* Names and labels shared by every template of the chart. */}}

{{- define "rdu-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rdu-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "rdu-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "rdu-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "rdu-operator.operatorSelector" -}}
app.kubernetes.io/name: {{ include "rdu-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "rdu-operator.devicePluginSelector" -}}
app.kubernetes.io/name: {{ include "rdu-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: device-plugin
{{- end -}}

{{/* Which node agent runs: "devicePlugin", "dra", or "" when devicePlugin.enabled is false. */}}
{{- define "rdu-operator.nodeAgent" -}}
{{- if .Values.devicePlugin.enabled -}}
{{- $api := .Values.devicePlugin.kubeletApi -}}
{{- if not (has $api (list "devicePlugin" "dra")) -}}
{{- fail (printf "devicePlugin.kubeletApi is %q: set it to devicePlugin (the extended resource rdu.dev/tile) or dra (ResourceClaims of driver rdu.dev)" (toString $api)) -}}
{{- end -}}
{{- $api -}}
{{- end -}}
{{- end -}}

{{- define "rdu-operator.draPluginSelector" -}}
app.kubernetes.io/name: {{ include "rdu-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: dra-plugin
{{- end -}}

{{- define "rdu-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "rdu-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "rdu-operator.operatorImage" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) -}}
{{- end -}}

{{- define "rdu-operator.devicePluginImage" -}}
{{- printf "%s:%s" .Values.devicePlugin.image.repository (default .Chart.AppVersion .Values.devicePlugin.image.tag) -}}
{{- end -}}

{{/* The operator's rules in the namespaces of the jobs it runs. */}}
{{- define "rdu-operator.jobNamespaceRules" -}}
# Watched by the controller; deleted when ttlSecondsAfterFinished passes.
- apiGroups: ["rdu.dev"]
  resources: ["rdujobs"]
  verbs: ["list", "watch", "delete"]
# Status is written by server-side apply to the status subresource.
- apiGroups: ["rdu.dev"]
  resources: ["rdujobs/status"]
  verbs: ["patch"]
# Children are created, never forced over an existing object: one of a child's name is read (get) to see
# whose it is, and only the job's own is kept (DESIGN 5.1).
# Rank pods: watched, created, deleted on gang restart/suspend.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "get", "create", "delete"]
# The headless Service: watched (owned), created; the job's own re-applied (patch); garbage-collected with
# the job.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["list", "watch", "get", "create", "patch"]
# A token Secret per generation, created; the generation before deleted. Never read, listed, watched or changed:
# its name holds the job's UID and the generation, so one that exists is the job's own (DESIGN 9).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create", "delete"]
# The checkpoint claim of spec.checkpoint.volumeClaimTemplate: created once and kept (its spec is immutable
# once bound, and it must outlive gang restarts); garbage-collected with the job.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "create"]
# The ResourceClaimTemplate of a job with spec.tileAllocation.api dra: created once and kept (a template's spec
# is immutable; a changed ask gets a template of another name); garbage-collected with the job. The rank pods'
# ResourceClaims are made from it by Kubernetes, not by the operator.
- apiGroups: ["resource.k8s.io"]
  resources: ["resourceclaimtemplates"]
  verbs: ["get", "create"]
{{- if .Values.networkPolicy.enabled }}
# The per-job NetworkPolicy, created; the job's own re-applied (patch); garbage-collected with the job.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch"]
{{- end }}
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# Gang scheduling through coscheduling's PodGroup, when that CRD is installed.
- apiGroups: ["scheduling.x-k8s.io"]
  resources: ["podgroups"]
  verbs: ["get", "create", "patch"]
{{- if .Values.kueue.enabled }}
# Kueue (kueue.enabled): a queued job's Workload, watched (owned: its admission, eviction or finish wakes the
# job), created, its spec.active patched; its status (PodsReady, the quota released after an eviction, Finished)
# applied as Kueue's own job controllers apply it.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list", "watch", "get", "create", "patch"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
{{- end }}
{{- end -}}
