{{/*
Labels every object carries: what kustomize's base sets (part-of) plus Helm's own.
*/}}
{{- define "gputopo.labels" -}}
app.kubernetes.io/part-of: gputopo
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
The release's name stem: fullnameOverride, else the release name when it already contains the
chart name (release "gputopo" gives "gputopo", the names deploy/ uses), else
<release>-<nameOverride or chart name>. Cut to 40 characters so that every name built on it
(longest: <stem>-device-plugin-metrics) stays within the 63 of a label value or Service name.
*/}}
{{- define "gputopo.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gputopo.pluginName" -}}
{{- include "gputopo.fullname" . }}-device-plugin
{{- end -}}

{{- define "gputopo.schedulerFullname" -}}
{{- include "gputopo.fullname" . }}-scheduler
{{- end -}}

{{/* The profile pods name in spec.schedulerName: the value, else <fullname>-scheduler. */}}
{{- define "gputopo.schedulerName" -}}
{{- .Values.schedulerName | default (include "gputopo.schedulerFullname" .) -}}
{{- end -}}

{{- define "gputopo.pluginLabels" -}}
app.kubernetes.io/name: {{ include "gputopo.pluginName" . }}
app.kubernetes.io/component: device-plugin
{{- end -}}

{{- define "gputopo.schedulerLabels" -}}
app.kubernetes.io/name: {{ include "gputopo.schedulerFullname" . }}
app.kubernetes.io/component: scheduler
{{- end -}}

{{/*
The kube-scheduler tag: the value when set, else the cluster's version as vMAJOR.MINOR.PATCH
(semver drops provider suffixes such as v1.30.4-eks-a737599 or v1.31.2-gke.1000).
*/}}
{{- define "gputopo.kubeSchedulerTag" -}}
{{- if .Values.images.kubeScheduler.tag -}}
{{- .Values.images.kubeScheduler.tag -}}
{{- else -}}
{{- $v := semver .Capabilities.KubeVersion.Version -}}
{{- printf "v%d.%d.%d" $v.Major $v.Minor $v.Patch -}}
{{- end -}}
{{- end -}}

{{- define "gputopo.image" -}}
{{- printf "%s:%s" .image.repository (.image.tag | default .root.Chart.AppVersion) -}}
{{- end -}}

{{/* "true" when the admission policy is rendered: on, or auto on a cluster serving it. */}}
{{- define "gputopo.admissionPolicyEnabled" -}}
{{- $e := .Values.admissionPolicy.enabled | toString -}}
{{- if or (eq $e "true") (and (eq $e "auto") (semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version)) -}}
true
{{- end -}}
{{- end -}}

{{- define "gputopo.pluginServiceAccount" -}}
{{- include "gputopo.pluginName" . -}}
{{- end -}}

{{- define "gputopo.nodeConfigsName" -}}
{{- .Values.plugin.configMapName | default (printf "%s-node-configs" (include "gputopo.fullname" .)) -}}
{{- end -}}

{{/*
"true" when the NVIDIA GPU Operator is taken to be installed: enabled true, or auto on a cluster
that serves its ClusterPolicy API (nvidia.com/v1), which only the operator installs.
*/}}
{{- define "gputopo.gpuOperator" -}}
{{- $e := .Values.gpuOperator.enabled | toString -}}
{{- if or (eq $e "true") (and (eq $e "auto") (.Capabilities.APIVersions.Has "nvidia.com/v1/ClusterPolicy")) -}}
true
{{- end -}}
{{- end -}}

{{- define "gputopo.runtimeClassName" -}}
{{- if .Values.plugin.runtimeClassName -}}
{{- .Values.plugin.runtimeClassName -}}
{{- else if include "gputopo.gpuOperator" . -}}
{{- .Values.gpuOperator.runtimeClassName -}}
{{- end -}}
{{- end -}}

{{/*
The opt-in mutation's form: "v1", "v1beta1" or "v1alpha1" (a MutatingAdmissionPolicy of that
admissionregistration.k8s.io version, the newest the cluster serves; v1 from 1.36), "webhook"
(a MutatingWebhookConfiguration served by the scheduler pods) or "" (off).
*/}}
{{- define "gputopo.optInMode" -}}
{{- $o := .Values.optIn -}}
{{- if $o.enabled -}}
{{- $api := .Capabilities.APIVersions -}}
{{- if eq $o.mode "webhook" -}}
webhook
{{- else if or (eq $o.mode "policy") (eq $o.mode "auto") -}}
{{- if or ($api.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy") (semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version) -}}
v1
{{- else if $api.Has "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy" -}}
v1beta1
{{- else if $api.Has "admissionregistration.k8s.io/v1alpha1/MutatingAdmissionPolicy" -}}
v1alpha1
{{- else if eq $o.mode "policy" -}}
{{- fail "optIn.mode=policy: this cluster serves no MutatingAdmissionPolicy API (v1 from Kubernetes 1.36, v1beta1/v1alpha1 only with --runtime-config); use mode auto or webhook" -}}
{{- else -}}
webhook
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The kubernetes.io/tls Secret the scheduler pods mount at /etc/gputopo/webhook-tls. */}}
{{- define "gputopo.webhookTLSSecret" -}}
{{- .Values.scheduler.webhook.tlsSecretName | default (printf "%s-webhook-tls" (include "gputopo.schedulerFullname" .)) -}}
{{- end -}}


{{/*
Cluster-scoped DRA objects (ClusterRole, its binding, the admission policy) carry the release's
stem: <stem>-dra-plugin..., gputopo-dra-plugin... for release "gputopo" (deploy/'s names). A
fixed name would make a second release's install fail, or with kubectl apply take the first
release's binding over.
*/}}
{{- define "gputopo.draPluginName" -}}
{{- include "gputopo.fullname" . }}-dra-plugin
{{- end -}}

{{/*
The DeviceClasses' domain, which users type: claims name <class>.<domain> (gpu, nvlink-<k>) and
containers limit <domain>/<class>. The driver name for the release whose stem is "gputopo" (the
names deploy/ uses), else <stem>.<driver>: DeviceClasses are cluster-scoped and each
extendedResourceName should be unique in the cluster, so a second release must not reuse the
first's. The extender sizes the classes of any such domain under gputopo.io.
*/}}
{{- define "gputopo.draClassDomain" -}}
{{- $stem := include "gputopo.fullname" . -}}
{{- if eq $stem "gputopo" -}}
{{- .Values.dra.driverName -}}
{{- else -}}
{{- printf "%s.%s" $stem .Values.dra.driverName -}}
{{- end -}}
{{- end -}}


{{/*
The value of the default opt-in label gputopo.io/opt-in: "true" for the release whose stem is
"gputopo" (deploy/'s label), else the stem. Two releases' default selectors are then disjoint:
a label has one value, so a namespace or pod opts in to one release, never to whichever
release's mutation happens to run first.
*/}}
{{- define "gputopo.optInLabelValue" -}}
{{- $stem := include "gputopo.fullname" . -}}
{{- if eq $stem "gputopo" }}true{{ else }}{{ $stem }}{{ end -}}
{{- end -}}

{{/*
The selector of each way to opt in, as YAML {namespace: ..., pod: ...}: optIn.namespaceSelector
and optIn.podSelector as set; empty (values.yaml's default) gives the release's default label
(gputopo.optInLabelValue); set to null (Helm then drops the key) leaves that way out. The
default lives here, not in values.yaml's maps, because Helm merges a user's map into the chart's:
a user's `matchLabels: {team: a}` would keep the default label beside it.
*/}}
{{- define "gputopo.optInSelectors" -}}
{{- $o := .Values.optIn -}}
{{- $default := dict "matchLabels" (dict "gputopo.io/opt-in" (include "gputopo.optInLabelValue" .)) -}}
{{- $out := dict -}}
{{- range $by := list "namespace" "pod" -}}
{{- $key := printf "%sSelector" $by -}}
{{- if hasKey $o $key -}}
{{- $_ := set $out $by (get $o $key | default $default) -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}
