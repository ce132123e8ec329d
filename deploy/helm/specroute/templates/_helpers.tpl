{{/* Names and labels. */}}
{{- define "specroute.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "specroute.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "specroute.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "specroute.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "specroute.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* "registry/repository:tag" of one image: (dict "root" $ "img" .Values.image.gateway) */}}
{{- define "specroute.image" -}}
{{- $registry := .root.Values.image.registry -}}
{{- $repo := .img.repository -}}
{{- $tag := default .root.Chart.AppVersion .img.tag -}}
{{- if $registry -}}{{ printf "%s/%s:%s" $registry $repo $tag }}{{- else -}}{{ printf "%s:%s" $repo $tag }}{{- end -}}
{{- end -}}

{{/* A pool's worker name (Deployment, headless Service, PDB): (dict "root" $ "pool" NAME) */}}
{{- define "specroute.workerName" -}}
{{- printf "%s-worker-%s" (include "specroute.fullname" .root) .pool | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "specroute.redisName" -}}
{{- printf "%s-redis" (include "specroute.fullname" .) -}}
{{- end -}}

{{/* The Redis URL as env var `name` (gateway: REDIS_URL, workers: SPECROUTE_WORKER_REDIS_URL):
     (dict "root" $ "name" "REDIS_URL") */}}
{{- define "specroute.redisEnv" -}}
{{- $r := .root.Values.redis -}}
{{- if $r.enabled }}
- name: {{ .name }}
  value: {{ printf "redis://%s:%d/0" (include "specroute.redisName" .root) (int $r.port) | quote }}
{{- else if $r.external.existingSecret }}
- name: {{ .name }}
  valueFrom:
    secretKeyRef: {name: {{ $r.external.existingSecret | quote }}, key: {{ $r.external.secretKey | quote }}}
{{- else if $r.external.url }}
- name: {{ .name }}
  value: {{ $r.external.url | quote }}
{{- end }}
{{- end -}}

{{- define "specroute.metricsAnnotations" -}}
{{- if .root.Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}
