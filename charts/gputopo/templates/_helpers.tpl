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

{{- define "gputopo.pluginLabels" -}}
app.kubernetes.io/name: gputopo-device-plugin
app.kubernetes.io/component: device-plugin
{{- end -}}

{{- define "gputopo.schedulerLabels" -}}
app.kubernetes.io/name: gputopo-scheduler
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
gputopo-device-plugin
{{- end -}}

{{- define "gputopo.runtimeClassName" -}}
{{- if .Values.plugin.runtimeClassName -}}
{{- .Values.plugin.runtimeClassName -}}
{{- else if .Values.gpuOperator.enabled -}}
{{- .Values.gpuOperator.runtimeClassName -}}
{{- end -}}
{{- end -}}
