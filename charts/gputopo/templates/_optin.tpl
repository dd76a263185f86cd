{{/*
The CEL both opt-in forms share (MutatingAdmissionPolicy matchConditions, and the webhook's
matchConditions so that the API server only calls it for such pods): the pod asks for
nvidia.com/gpu (a non-zero request or limit in any container or init container) and names no
scheduler of its own choice (unset, empty or default-scheduler; the API server defaults an
unset name to default-scheduler before admission). No optional syntax (.?, orValue): the
tests evaluate it with cel-python, which lacks it.
*/}}
{{- define "gputopo.optInConditions" -}}
- name: asks-for-gpus
  expression: >-
    (object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : [])).exists(c,
    has(c.resources) &&
    ((has(c.resources.limits) && 'nvidia.com/gpu' in c.resources.limits && string(c.resources.limits['nvidia.com/gpu']) != '0') ||
    (has(c.resources.requests) && 'nvidia.com/gpu' in c.resources.requests && string(c.resources.requests['nvidia.com/gpu']) != '0')))
- name: names-no-scheduler
  expression: >-
    !has(object.spec.schedulerName) || object.spec.schedulerName == '' ||
    object.spec.schedulerName == 'default-scheduler'
{{- end -}}
