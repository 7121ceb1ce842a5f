{{/* Names and labels. */}}
{{- define "batchyard.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "batchyard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: include "batchyard.selector" (list . "api") */}}
{{- define "batchyard.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ $root.Chart.Name }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "batchyard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "batchyard.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "batchyard.configMapName" -}}
{{- default (printf "%s-config" (include "batchyard.fullname" .)) .Values.existingConfigMap -}}
{{- end -}}

{{- define "batchyard.keysSecretName" -}}
{{- default (printf "%s-keys" (include "batchyard.fullname" .)) .Values.keys.existingSecret -}}
{{- end -}}

{{- define "batchyard.hasKeys" -}}
{{- if or .Values.keys.existingSecret .Values.keys.values }}true{{ end -}}
{{- end -}}

{{/* The image of a pool: include "batchyard.image" (list $image $defaultTag) */}}
{{- define "batchyard.image" -}}
{{- $image := index . 0 -}}
{{- printf "%s:%s" $image.repository (default (index . 1) $image.tag) -}}
{{- end -}}

{{/* The upstream routes: every model_name whose model is not vllm/... (or autoscaling.keda.upstreamRoutes). */}}
{{- define "batchyard.upstreamRoutes" -}}
{{- $routes := list -}}
{{- if .Values.autoscaling.keda.upstreamRoutes -}}
{{- $routes = .Values.autoscaling.keda.upstreamRoutes -}}
{{- else if not .Values.existingConfigMap -}}
{{- range .Values.config.model_list -}}
{{- if not (hasPrefix "vllm/" .litellm_params.model) -}}
{{- $routes = append $routes .model_name -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson (uniq $routes) -}}
{{- end -}}

{{/* "true" when the chart runs its own Redis: no redis.url and no redis.existingSecret. */}}
{{- define "batchyard.bundledRedis" -}}
{{- if not (or .Values.redis.url .Values.redis.existingSecret) }}true{{ end -}}
{{- end -}}

{{- define "batchyard.redisHost" -}}
{{- printf "%s-redis" (include "batchyard.fullname" .) -}}
{{- end -}}

{{/* The Redis URL of every batchyard container: BATCHYARD_REDIS_URL, which serve and worker read when no
--redis-url is given (a password from a Secret stays out of the process's arguments). */}}
{{- define "batchyard.redisEnv" -}}
- name: BATCHYARD_REDIS_URL
{{- if .Values.redis.existingSecret }}
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.existingSecret }}
      key: {{ .Values.redis.urlKey }}
{{- else if .Values.redis.url }}
  value: {{ .Values.redis.url | quote }}
{{- else }}
  value: {{ printf "redis://%s:6379/0" (include "batchyard.redisHost" .) | quote }}
{{- end }}
{{- end -}}

{{/* Environment shared by the API and the workers. */}}
{{- define "batchyard.env" -}}
{{ include "batchyard.redisEnv" . }}
- name: AWS_DEFAULT_REGION
  value: {{ .Values.s3.region | quote }}
{{- with .Values.s3.endpointUrl }}
- name: AWS_ENDPOINT_URL_S3
  value: {{ . | quote }}
{{- end }}
{{- with .Values.tracing.otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
- name: OTEL_SERVICE_NAME
  value: {{ $.Values.tracing.serviceName | quote }}
{{- with $.Values.tracing.sampler }}
- name: OTEL_TRACES_SAMPLER
  value: {{ . | quote }}
{{- end }}
{{- with $.Values.tracing.samplerArg }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "batchyard.envFrom" -}}
{{- if include "batchyard.hasKeys" . }}
- secretRef:
    name: {{ include "batchyard.keysSecretName" . }}
{{- end }}
{{- with .Values.s3.existingSecret }}
- secretRef:
    name: {{ . }}
{{- end }}
{{- end -}}

{{/* The flags every batchyard process of the cluster shares. */}}
{{- define "batchyard.sharedArgs" -}}
- --config
- /config/team.yaml
{{- if .Values.redis.tls.caSecret }}
- --redis-ca-file
- {{ printf "/etc/batchyard/redis-ca/%s" .Values.redis.tls.caKey | quote }}
{{- end }}
{{- if .Values.redis.allowEvicting }}
- --allow-evicting-redis
{{- end }}
- --blobs
- {{ printf "s3://%s/%s" .Values.s3.bucket (trimAll "/" .Values.s3.prefix) | trimSuffix "/" }}
- --claim-idle
- {{ .Values.claimIdle | quote }}
{{- end -}}

{{/* The CA of a rediss:// Redis (redis.tls.caSecret), mounted where --redis-ca-file names it. */}}
{{- define "batchyard.redisCaMount" -}}
{{- if .Values.redis.tls.caSecret }}
- name: redis-ca
  mountPath: /etc/batchyard/redis-ca
  readOnly: true
{{- end }}
{{- end -}}

{{- define "batchyard.redisCaVolume" -}}
{{- if .Values.redis.tls.caSecret }}
- name: redis-ca
  secret:
    secretName: {{ .Values.redis.tls.caSecret }}
{{- end }}
{{- end -}}

{{/* Pod annotations: config/keys checksums (a change rolls the pods) and the scrape annotations. */}}
{{- define "batchyard.podAnnotations" -}}
{{- $root := index . 0 -}}
checksum/config: {{ toJson $root.Values.config | sha256sum }}
checksum/keys: {{ toJson $root.Values.keys.values | sha256sum }}
{{- if $root.Values.metrics.annotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ index . 1 | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}
