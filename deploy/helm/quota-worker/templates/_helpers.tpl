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
amqpUrls: QUOTA_WORKER__AMQP__URLS_FILE
redisClusterUrls: QUOTA_WORKER__REDIS__CLUSTER_URLS_FILE
redisSentinelUrls: QUOTA_WORKER__REDIS__SENTINEL__URLS_FILE
{{- end }}

{{/* The ServiceAccount of the pods. */}}
{{- define "quota-worker.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "quota-worker.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Seconds of a duration of the worker's configuration ("500ms", "30s", "10m", "24h"). */}}
{{- define "quota-worker.seconds" -}}
{{- $n := regexFind "^[0-9]+" . | float64 }}
{{- $unit := regexFind "[a-z]+$" . }}
{{- mulf $n (get (dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0) $unit) }}
{{- end }}

{{/*
What values.schema.json cannot say: refused with the reason, before anything is
applied.
*/}}
{{- define "quota-worker.refuse" -}}
{{- $v := .Values }}
{{- if and $v.autoscaling.keda.enabled $v.autoscaling.hpa.enabled }}
{{- fail "autoscaling.keda and autoscaling.hpa: enable one (KEDA makes an HPA of its own)" }}
{{- end }}
{{- if gt (int64 $v.autoscaling.keda.minReplicaCount) (int64 $v.autoscaling.keda.maxReplicaCount) }}
{{- fail (printf "autoscaling.keda.minReplicaCount %d is above maxReplicaCount %d" (int64 $v.autoscaling.keda.minReplicaCount) (int64 $v.autoscaling.keda.maxReplicaCount)) }}
{{- end }}
{{- if gt (int64 $v.autoscaling.hpa.minReplicas) (int64 $v.autoscaling.hpa.maxReplicas) }}
{{- fail (printf "autoscaling.hpa.minReplicas %d is above maxReplicas %d" (int64 $v.autoscaling.hpa.minReplicas) (int64 $v.autoscaling.hpa.maxReplicas)) }}
{{- end }}
{{- $worker := default dict $v.config.worker }}
{{- $grace := default "20s" $worker.shutdown_grace }}
{{- if not (kindIs "string" $grace) }}
{{- fail (printf "config.worker.shutdown_grace must be a duration such as 20s, not %v" $grace) }}
{{- end }}
{{- $need := addf (include "quota-worker.seconds" $grace | float64) (float64 $v.preStopSleepSeconds) }}
{{- if le (float64 $v.terminationGracePeriodSeconds) $need }}
{{- fail (printf "terminationGracePeriodSeconds %d must be more than preStopSleepSeconds %d plus config.worker.shutdown_grace %s: Kubernetes kills the worker at the grace period, before it has handed back what it holds" (int64 $v.terminationGracePeriodSeconds) (int64 $v.preStopSleepSeconds) $grace) }}
{{- end }}
{{- if and (not (hasKey $v.podSecurityContext "fsGroup")) (eq (int (mod (int $v.secrets.defaultMode) 8)) 0) }}
{{- fail (printf "secrets.defaultMode %#o without podSecurityContext.fsGroup: the Secret's files would be root's alone and the worker could not read them; set podSecurityContext.fsGroup (the chart's default is 10001) or a mode others may read" (int $v.secrets.defaultMode)) }}
{{- end }}
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

{{/*
The TOML of a map (dict "map" M "path" TABLE; TABLE "" at the top): its keys that are
not tables, then each table as [TABLE.KEY]. Written here rather than with toToml:
YAML numbers reach a template as floats, which toToml writes 1e+06 or 1.048576e+06;
whole numbers are written as integers, exactly. Null values are left out.
*/}}
{{- define "quota-worker.toml" -}}
{{- $path := .path }}
{{- range $k, $v := .map }}
{{- if not (or (kindIs "map" $v) (kindIs "invalid" $v)) }}
{{ include "quota-worker.tomlKey" $k }} = {{ include "quota-worker.tomlValue" $v }}
{{- end }}
{{- end }}
{{- range $k, $v := .map }}
{{- if kindIs "map" $v }}
{{- $table := include "quota-worker.tomlKey" $k }}
{{- if $path }}{{ $table = printf "%s.%s" $path $table }}{{ end }}

[{{ $table }}]
{{- include "quota-worker.toml" (dict "map" $v "path" $table) }}
{{- end }}
{{- end }}
{{- end }}

{{/* A TOML key: bare when it may be, else quoted. */}}
{{- define "quota-worker.tomlKey" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . }}{{ . }}{{ else }}{{ toJson . }}{{ end }}
{{- end }}

{{/* A TOML value: strings quoted (JSON's escapes are TOML's), whole numbers as
integers, lists inline, maps in lists as inline tables. */}}
{{- define "quota-worker.tomlValue" -}}
{{- if kindIs "string" . }}{{ toJson . }}
{{- else if kindIs "bool" . }}{{ . }}
{{- else if or (kindIs "float64" .) (kindIs "int" .) (kindIs "int64" .) }}
{{- if eq (float64 .) (floor .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else if kindIs "slice" . }}[{{ range $i, $x := . }}{{ if $i }}, {{ end }}{{ include "quota-worker.tomlValue" $x }}{{ end }}]
{{- else if kindIs "map" . }}{ {{- range $i, $k := keys . | sortAlpha }}{{ if $i }},{{ end }} {{ include "quota-worker.tomlKey" $k }} = {{ include "quota-worker.tomlValue" (get $ $k) }}{{ end }} }
{{- else }}{{ fail (printf "config: %v is a value TOML cannot hold" .) }}
{{- end }}
{{- end }}
