{{/* The chart's name. */}}
{{- define "quota-worker.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The objects' name: the release's, with the chart's unless it already holds it. */}}
{{- define "quota-worker.fullname" -}}
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

{{/* Labels of every object. */}}
{{- define "quota-worker.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "quota-worker.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select the worker's pods. */}}
{{- define "quota-worker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "quota-worker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The Secret the worker reads its secrets from. */}}
{{- define "quota-worker.secretName" -}}
{{- if .Values.secrets.create }}
{{- include "quota-worker.fullname" . }}
{{- else }}
{{- default (include "quota-worker.fullname" .) .Values.secrets.existingSecret }}
{{- end }}
{{- end }}

{{/* The port of config.http.listen ("0.0.0.0:9464" -> 9464). */}}
{{- define "quota-worker.port" -}}
{{- $listen := required "config.http.listen is required: the worker must listen beyond loopback for its probes" .Values.config.http.listen }}
{{- splitList ":" $listen | last | int }}
{{- end }}

{{/*
The worker's configuration variable of each secret (QUOTA_WORKER__<KEY>_FILE names the
file it is read from: src/config/env.rs).
*/}}
{{- define "quota-worker.secretVars" -}}
amqpUrl: QUOTA_WORKER__AMQP__URL_FILE
redisUrl: QUOTA_WORKER__REDIS__URL_FILE
hashKey: QUOTA_WORKER__REDIS__HASH_KEY_FILE
adminToken: QUOTA_WORKER__HTTP__ADMIN_TOKEN_FILE
apiToken: QUOTA_WORKER__HTTP__API_TOKEN_FILE
{{- end }}

{{/* The queues that hold the work due now: the jobs queue and every lane queue of
each paced channel (one with a `rate`). Never the delay ladder: a job there waits for
its time, and more workers would not send it sooner. One name a line. */}}
{{- define "quota-worker.dueQueues" -}}
{{- $amqp := default dict .Values.config.amqp }}
{{- $lanes := default dict .Values.config.lanes }}
{{- $prefix := default "notify.lanes." $lanes.queue_prefix }}
{{- default "notify.jobs" $amqp.jobs_queue }}
{{- range $channel, $settings := (default dict .Values.config.channels) }}
{{- if and (kindIs "map" $settings) (hasKey $settings "rate") }}
{{- range list "urgent" "normal" "bulk" }}
{{ printf "%s%s.%s" $prefix $channel . }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
