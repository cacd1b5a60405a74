{{/* Names: the release's RayCluster and everything around it share one prefix. */}}
{{- define "mship.fullname" -}}
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

{{- define "mship.labels" -}}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The image of a variant: control (no engines), cpu or cuda. */}}
{{- define "mship.image" -}}
{{- $root := index . 0 -}}
{{- printf "%s:%s-%s" $root.Values.image.repository (default $root.Chart.AppVersion $root.Values.image.tag) (index . 1) -}}
{{- end -}}

{{- define "mship.clusterSecret" -}}{{ include "mship.fullname" . }}-cluster{{- end -}}
{{- define "mship.tokenSecret" -}}{{ default (include "mship.clusterSecret" .) .Values.auth.existingSecret }}{{- end -}}
{{/* Whether Redis has a password: the chart's own always; yours when you name its Secret. */}}
{{- define "mship.redisPassword" -}}
{{- if or .Values.redis.internal.enabled .Values.redis.passwordSecret.name }}true{{ end -}}
{{- end -}}
{{- define "mship.redisSecret" -}}{{ default (printf "%s-redis" (include "mship.fullname" .)) .Values.redis.passwordSecret.name }}{{- end -}}
{{- define "mship.redisAddress" -}}
{{- if .Values.redis.internal.enabled -}}{{ include "mship.fullname" . }}-redis:6379{{- else -}}{{ .Values.redis.address }}{{- end -}}
{{- end -}}
{{- define "mship.coordinator" -}}{{ include "mship.fullname" . }}-coordinator:{{ .Values.coordinatorPort }}{{- end -}}
{{- define "mship.cacheClaim" -}}{{ default (printf "%s-cache" (include "mship.fullname" .)) .Values.cache.persistence.existingClaim }}{{- end -}}

{{/* The cluster token, as every mship process reads it (KubeRay's authOptions gives Ray its own copy). */}}
{{- define "mship.tokenEnv" -}}
- name: MSHIP_RAY_AUTH_TOKEN
  valueFrom: {secretKeyRef: {name: {{ include "mship.tokenSecret" . }}, key: auth_token}}
{{- end -}}

{{/* What every Ray container (head and worker groups) has: its address and limits for the
     command line, the token, the cache, logs and Hugging Face access. */}}
{{- define "mship.nodeEnv" -}}
- name: POD_IP
  valueFrom: {fieldRef: {fieldPath: status.podIP}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: POD_CPU_LIMIT
  valueFrom: {resourceFieldRef: {resource: limits.cpu, divisor: "1"}}
- name: POD_MEMORY_LIMIT
  valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: "1"}}
{{ include "mship.tokenEnv" . }}
- name: MSHIP_CACHE_DIR
  value: {{ .Values.cache.mountPath | quote }}
# Hugging Face downloads and vLLM's compiled kernels on the same volume as the builtin models
- name: HF_HOME
  value: {{ printf "%s/huggingface" .Values.cache.mountPath | quote }}
- name: VLLM_CACHE_ROOT
  value: {{ printf "%s/vllm" .Values.cache.mountPath | quote }}
- name: MSHIP_LOG_FORMAT
  value: {{ .Values.observability.logFormat | quote }}
- name: MSHIP_LOG_LEVEL
  value: {{ .Values.observability.logLevel | quote }}
{{- if .Values.gateway.apiKeysSecret }}
- name: MSHIP_API_KEYS_FILE
  value: /etc/mship/api-keys/keys
{{- end }}
{{- if .Values.huggingFace.tokenSecret.name }}
- name: HF_TOKEN
  valueFrom: {secretKeyRef: {name: {{ .Values.huggingFace.tokenSecret.name }}, key: {{ .Values.huggingFace.tokenSecret.key }}}}
{{- end }}
{{- if .Values.huggingFace.offline }}
- name: HF_HUB_OFFLINE
  value: "1"
{{- end }}
{{- end -}}

{{/* The telemetry flags of `mship start` and `mship join`. */}}
{{- define "mship.telemetryArgs" -}}
{{- if gt (int .Values.observability.metricsPort) 0 }}
- --metrics-port={{ .Values.observability.metricsPort }}
{{- else }}
- --no-metrics
{{- end }}
{{- with .Values.observability.otelEndpoint }}
- --otel-endpoint={{ . }}
{{- end }}
- --dashboard-agent-port={{ .Values.ray.dashboardAgentPort }}
{{- end -}}

{{/* The ports of a Ray container: the agent (probes), metrics, and the gateway's HTTP where one may run. */}}
{{- define "mship.nodePorts" -}}
- {name: ray-agent, containerPort: {{ .Values.ray.dashboardAgentPort }}}
{{- if gt (int .Values.observability.metricsPort) 0 }}
- {name: metrics, containerPort: {{ .Values.observability.metricsPort }}}
{{- end }}
{{- end -}}

{{/* Liveness and start-up of a Ray node: Ray's own agent answers /api/healthz for its raylet
     (and, on the head, the GCS), the check KubeRay itself uses. */}}
{{- define "mship.nodeProbes" -}}
{{- $root := index . 0 -}}
startupProbe:
  httpGet: {path: /api/healthz, port: ray-agent}
  periodSeconds: 5
  failureThreshold: 60
livenessProbe:
  httpGet: {path: /api/healthz, port: ray-agent}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: {{ index . 1 }}
{{- end -}}

{{- define "mship.gatewayReadiness" -}}
readinessProbe:
  httpGet: {path: {{ .Values.gateway.readinessPath | quote }}, port: http}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
{{- end -}}

{{- define "mship.volumeMounts" -}}
- {name: cache, mountPath: {{ .Values.cache.mountPath }}}
- {name: dshm, mountPath: /dev/shm}
{{- if .Values.gateway.apiKeysSecret }}
- {name: api-keys, mountPath: /etc/mship/api-keys, readOnly: true}
{{- end }}
{{- end -}}

{{- define "mship.volumes" -}}
- name: cache
{{- if .Values.cache.persistence.enabled }}
  persistentVolumeClaim: {claimName: {{ include "mship.cacheClaim" . }}}
{{- else }}
  emptyDir: {}
{{- end }}
# Ray's object store and vLLM's engine processes (NCCL too) use shared memory: a container's
# /dev/shm is 64 MiB, with which Ray falls back to disk and tensor-parallel vLLM fails (docker/
# README.md's --shm-size). In memory: it counts against the container's memory limit.
- name: dshm
  emptyDir: {medium: Memory}
{{- if .Values.gateway.apiKeysSecret }}
- name: api-keys
  secret: {secretName: {{ .Values.gateway.apiKeysSecret }}}
{{- end }}
{{- end -}}

{{/* Ray custom resources a group advertises, for KubeRay's autoscaler (the node itself
     advertises the same at `ray start`: capabilities.py and the gateway resource). */}}
{{- define "mship.groupResources" -}}
{{- $caps := index . 0 -}}
{{- $gateway := index . 1 -}}
{{- $out := dict -}}
{{- range $caps }}{{ $_ := set $out (printf "mship_%s" .) "1000" }}{{ end -}}
{{- if $gateway }}{{ $_ := set $out "mship_gateway" "1000" }}{{ end -}}
{{- toYaml $out -}}
{{- end -}}

{{- define "mship.secret" -}}
{{/* A random secret value, or the one a previous release made (so an upgrade keeps it). */}}
{{- $existing := lookup "v1" "Secret" (index . 0).Release.Namespace (index . 1) -}}
{{- if and $existing (hasKey $existing.data (index . 2)) -}}
{{- index $existing.data (index . 2) -}}
{{- else -}}
{{- index . 3 | b64enc -}}
{{- end -}}
{{- end -}}
