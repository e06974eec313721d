{{/* Names, labels, and the values the chart derives from others. */}}

{{- define "pushd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pushd.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "pushd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pushd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "pushd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "pushd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The Secret holding the URLs and keys: the operator's or the chart's. */}}
{{- define "pushd.secretName" -}}
{{- .Values.secrets.existingSecret | default (include "pushd.fullname" .) }}
{{- end }}

{{/* Where the file-backed secrets are mounted. */}}
{{- define "pushd.secretDir" -}}
/etc/pushd/secrets
{{- end }}

{{/* The SIGKILL deadline: the preStop sleep, then the whole drain, then the
release of Redis and PostgreSQL. */}}
{{- define "pushd.gracePeriod" -}}
{{- $d := .Values.drain }}
{{- add (int $d.preStopSleepSeconds) (int $d.timeoutSeconds) (int $d.marginSeconds) }}
{{- end }}

{{/* Long enough for one node's reconnect wave: the longest delay clients
are told plus the half of the drain over which they are told. */}}
{{- define "pushd.minReadySeconds" -}}
{{- if kindIs "invalid" .Values.minReadySeconds }}
{{- add (int .Values.drain.reconnectAfterSeconds) (div (int .Values.drain.timeoutSeconds) 2) }}
{{- else }}
{{- int .Values.minReadySeconds }}
{{- end }}
{{- end }}

{{/* GOMEMLIMIT: the value, or 90 % of the memory limit. */}}
{{- define "pushd.goMemLimit" -}}
{{- if .Values.goMemLimit }}
{{- .Values.goMemLimit }}
{{- else }}
{{- $m := dig "limits" "memory" "" .Values.resources | toString }}
{{- if hasSuffix "Mi" $m }}
{{- printf "%dMiB" (div (mul (trimSuffix "Mi" $m | atoi) 9) 10) }}
{{- else if hasSuffix "Gi" $m }}
{{- printf "%dMiB" (div (mul (trimSuffix "Gi" $m | atoi) 1024 9) 10) }}
{{- else }}
{{- fail (printf "resources.limits.memory %q: give it in Mi or Gi, or set goMemLimit" $m) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Redis roles with a URL of their own, checked against the mode. */}}
{{- define "pushd.separateRoles" -}}
{{- $roles := .Values.redis.separateRoles | default list }}
{{- if and (eq .Values.redis.mode "cluster") $roles }}
{{- fail "redis.separateRoles: a Redis Cluster serves every role; --redis-cluster refuses the role URLs" }}
{{- end }}
{{- range $roles }}
{{- if not (has . (list "cache" "control" "realtime")) }}
{{- fail (printf "redis.separateRoles: %q is not a role; want cache, control or realtime" .) }}
{{- end }}
{{- end }}
{{- join "," $roles }}
{{- end }}

{{/* Settings the chart sets from its own values, refused in .Values.config. */}}
{{- define "pushd.managedSettings" -}}
listen admin-listen node-name drain-timeout reconnect-after max-conns expected-nodes trusted-proxies
redis-url redis-cluster redis-cache-url redis-control-url redis-realtime-url key-prefix
database-url read-changes streams stream-maxlen jwt-secret jwt-secret-file jwt-public-key api-key api-key-file
{{- end }}
