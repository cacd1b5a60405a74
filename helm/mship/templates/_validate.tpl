{{/* What values.schema.json cannot say (it compares no two values): checked at render, each
     failure naming the value to change. */}}
{{- define "mship.validate" -}}
{{- $offered := .Values.head.capabilities | default list -}}
{{- $names := dict -}}
{{- range $i, $g := .Values.workerGroups -}}
{{- if hasKey $names $g.name -}}
{{- fail (printf "workerGroups[%d].name: %q is used twice; each group needs its own name" $i $g.name) -}}
{{- end -}}
{{- $_ := set $names $g.name true -}}
{{- if or (lt (int $g.replicas) (int $g.minReplicas)) (gt (int $g.replicas) (int $g.maxReplicas)) -}}
{{- fail (printf "workerGroups[%d] (%s): replicas %v must lie between minReplicas %v and maxReplicas %v" $i $g.name $g.replicas $g.minReplicas $g.maxReplicas) -}}
{{- end -}}
{{- if not (or $g.capabilities $g.gateway) -}}
{{- fail (printf "workerGroups[%d] (%s): no capabilities and no gateway: the group would host nothing" $i $g.name) -}}
{{- end -}}
{{- $offered = concat $offered $g.capabilities -}}
{{- end -}}
{{- $models := dict -}}
{{- range $i, $m := .Values.models -}}
{{- if hasKey $models $m.name -}}
{{- fail (printf "models[%d].name: %q is used twice" $i $m.name) -}}
{{- end -}}
{{- $_ := set $models $m.name true -}}
{{- $loader := default "vllm" $m.loader -}}
{{- if not (has $loader $offered) -}}
{{- fail (printf "models[%d] (%s): loader %s runs on no node: add it to the capabilities of a workerGroups entry (or head.capabilities)" $i $m.name $loader) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.observability.podMonitor.enabled (eq (int .Values.observability.metricsPort) 0) -}}
{{- fail "observability.podMonitor.enabled needs observability.metricsPort above 0 (the port it scrapes)" -}}
{{- end -}}
{{- if and (gt (int .Values.gateway.maxReplicas) 0) (lt (int .Values.gateway.maxReplicas) (int .Values.gateway.minReplicas)) -}}
{{- fail (printf "gateway.maxReplicas %v is below gateway.minReplicas %v" .Values.gateway.maxReplicas .Values.gateway.minReplicas) -}}
{{- end -}}
{{- end -}}
