{{/* Names, labels and the derived settings every template shares. */}}

{{- define "herald.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: the release name alone when it already says herald. */}}
{{- define "herald.fullname" -}}
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

{{- define "herald.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. helm.sh/chart and managed-by are Helm's own:
the kustomize base (k8s/base) is this chart's render without those two. */}}
{{- define "herald.labels" -}}
helm.sh/chart: {{ include "herald.chart" . }}
app.kubernetes.io/name: {{ include "herald.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: herald
{{- end }}

{{/* The gateway pods: selector labels never change after install. */}}
{{- define "herald.selectorLabels" -}}
app.kubernetes.io/name: {{ include "herald.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end }}

{{- define "herald.redisSelectorLabels" -}}
app.kubernetes.io/name: {{ include "herald.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: redis
{{- end }}

{{- define "herald.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "herald.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "herald.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "herald.apiFullname" -}}
{{- printf "%s-api" (include "herald.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "herald.redisFullname" -}}
{{- printf "%s-redis" (include "herald.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The API Service's own labels: the ServiceMonitor picks it (and not the
clients' Service) by app.kubernetes.io/component: api. Its selector is the
gateway pods', as the clients' Service's. */}}
{{- define "herald.apiServiceLabels" -}}
app.kubernetes.io/name: {{ include "herald.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: api
{{- end }}

{{/* The Secret the credentials come from: the user's (auth.existingSecret)
or the chart's <fullname>-auth, made when values give any. Empty: none. */}}
{{- define "herald.authSecretName" -}}
{{- $a := .Values.auth }}
{{- if $a.existingSecret }}
{{- $a.existingSecret }}
{{- else if or $a.apiKeys $a.hmacSecret $a.publicKey }}
{{- printf "%s-auth" (include "herald.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The credentials the pod reads from that Secret, as JSON: environment
variable -> key in the Secret. Only the keys the Secret holds: the chart's
has a key per value given; the user's, those existingSecretKeys names. */}}
{{- define "herald.authSecretKeys" -}}
{{- $a := .Values.auth }}
{{- $keys := dict }}
{{- if $a.existingSecret }}
{{- with $a.existingSecretKeys.apiKeys }}{{ $_ := set $keys "HERALD_HTTP__API_KEYS" . }}{{ end }}
{{- with $a.existingSecretKeys.hmacSecret }}{{ $_ := set $keys "HERALD_AUTH__HMAC_SECRET" . }}{{ end }}
{{- with $a.existingSecretKeys.publicKey }}{{ $_ := set $keys "HERALD_AUTH__PUBLIC_KEY" . }}{{ end }}
{{- else }}
{{- if $a.apiKeys }}{{ $_ := set $keys "HERALD_HTTP__API_KEYS" "api-keys" }}{{ end }}
{{- if $a.hmacSecret }}{{ $_ := set $keys "HERALD_AUTH__HMAC_SECRET" "hmac-secret" }}{{ end }}
{{- if $a.publicKey }}{{ $_ := set $keys "HERALD_AUTH__PUBLIC_KEY" "public-key" }}{{ end }}
{{- end }}
{{- toJson $keys }}
{{- end }}

{{/* Which credentials are missing, as a JSON list: "apiKeys" (anyone who
reaches the API port publishes, disconnects clients and reads the admin API)
and "tokenKey" (every client is anonymous and reads every topic). */}}
{{- define "herald.authMissing" -}}
{{- $keys := include "herald.authSecretKeys" . | fromJson }}
{{- $missing := list }}
{{- if not (hasKey $keys "HERALD_HTTP__API_KEYS") }}{{ $missing = append $missing "apiKeys" }}{{ end }}
{{- if not (or (hasKey $keys "HERALD_AUTH__HMAC_SECRET") (hasKey $keys "HERALD_AUTH__PUBLIC_KEY") .Values.auth.jwksUrl) }}
{{- $missing = append $missing "tokenKey" }}
{{- end }}
{{- toJson $missing }}
{{- end }}

{{/* The refusal to render an open herald: each missing credential opens
something (above), and only auth.open=true says that is meant. */}}
{{- define "herald.checkAuth" -}}
{{- $a := .Values.auth }}
{{- if and $a.existingSecret (or $a.apiKeys $a.hmacSecret $a.publicKey) }}
{{- fail "auth.existingSecret replaces auth.apiKeys, auth.hmacSecret and auth.publicKey: set the Secret or those values, not both" }}
{{- end }}
{{- $missing := include "herald.authMissing" . | fromJsonArray }}
{{- $why := list }}
{{- if has "apiKeys" $missing }}
{{- $why = append $why "no API keys for the backend API (set auth.apiKeys, or auth.existingSecret holding them under auth.existingSecretKeys.apiKeys)" }}
{{- end }}
{{- if has "tokenKey" $missing }}
{{- $why = append $why "no key to check clients' tokens with (set auth.hmacSecret, auth.publicKey or auth.jwksUrl, or auth.existingSecret holding one under auth.existingSecretKeys.hmacSecret or .publicKey)" }}
{{- end }}
{{- if and $why (not $a.open) }}
{{- fail (printf "refusing to render an open herald: %s. To run it open anyway, set auth.open=true: any client may then read any topic, and anyone who can reach the API port may publish" (join "; " $why)) }}
{{- end }}
{{- /* A public key or a JWKS signs for other services too: without aud
(and iss) checked, their tokens would be taken here (herald warns). */}}
{{- $keys := include "herald.authSecretKeys" . | fromJson }}
{{- if and (or (hasKey $keys "HERALD_AUTH__PUBLIC_KEY") $a.jwksUrl) (or (not $a.audience) (not $a.issuer)) (not $a.anyAudience) }}
{{- fail "auth.publicKey or auth.jwksUrl is set without auth.audience and auth.issuer: tokens its issuer made for any other service (or any issuer the key signs for) would be accepted. Set both, or auth.anyAudience=true to accept that" }}
{{- end }}
{{- /* herald refuses these at start; better said here than in a crash loop. */}}
{{- if has "tokenKey" $missing }}
{{- range $name, $ns := .Values.config.namespaces }}
{{- if and $ns (or (eq (toString $ns.subscribe) "granted") (eq (toString $ns.publish) "granted") $ns.personal) }}
{{- fail (printf "namespace %s grants by token (granted or personal), but there is no key to check tokens with: set auth.hmacSecret, auth.publicKey or auth.jwksUrl (or an auth.existingSecret holding one)" $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* What auth.open leaves open, one line each (NOTES.txt warns); empty
when nothing is. */}}
{{- define "herald.openParts" -}}
{{- $missing := include "herald.authMissing" . | fromJsonArray }}
{{- if has "apiKeys" $missing }}
  - no API keys: anything that reaches {{ include "herald.apiFullname" . }} can publish,
    disconnect clients and use the admin API.
{{- end }}
{{- if has "tokenKey" $missing }}
  - no key to check tokens with: any client can read any topic.
{{- end }}
{{- end }}

{{/* "redis" when a shared broker is configured, else "memory". Fails on
settings that contradict each other. */}}
{{- define "herald.broker" -}}
{{- $r := .Values.redis }}
{{- $sources := 0 }}
{{- if $r.url }}{{ $sources = add1 $sources }}{{ end }}
{{- if $r.urlSecret.name }}{{ $sources = add1 $sources }}{{ end }}
{{- if $r.inChart.enabled }}{{ $sources = add1 $sources }}{{ end }}
{{- if gt $sources 1 }}
{{- fail "set only one of redis.url, redis.urlSecret.name and redis.inChart.enabled" }}
{{- end }}
{{- if and $r.sentinel.masterName $r.inChart.enabled }}
{{- fail "redis.sentinel.masterName and redis.inChart.enabled exclude each other: the in-chart Redis has no sentinels" }}
{{- end }}
{{- if and $r.sentinel.masterName (not $r.sentinel.addresses) }}
{{- fail "redis.sentinel.masterName needs redis.sentinel.addresses (host:port of each sentinel)" }}
{{- end }}
{{- if and $r.cluster $r.sentinel.masterName }}
{{- fail "redis.cluster and redis.sentinel.masterName exclude each other: a Redis Cluster fails over by itself, without sentinels. Set redis.cluster for a cluster, redis.sentinel for Redis under Sentinel" }}
{{- end }}
{{- if and $r.cluster $r.inChart.enabled }}
{{- fail "redis.cluster and redis.inChart.enabled exclude each other: the in-chart Redis is a single node, not a cluster. Point redis.cluster at your Redis Cluster's nodes, or drop it" }}
{{- end }}
{{- if or (gt $sources 0) $r.sentinel.masterName $r.cluster }}redis{{ else }}memory{{ end }}
{{- end }}

{{/* The ports of redis.cluster's node URLs, as a JSON list without
repeats (6379 for a URL that gives none, as herald takes it). */}}
{{- define "herald.redisClusterPorts" -}}
{{- $ports := list }}
{{- range .Values.redis.cluster }}
{{- $host := (urlParse .).host }}
{{- $port := 6379 }}
{{- if regexMatch ":[0-9]+$" $host }}{{ $port = regexFind "[0-9]+$" $host | atoi }}{{ end }}
{{- $ports = append $ports $port }}
{{- end }}
{{- toJson ($ports | uniq) }}
{{- end }}

{{/* Where the Secret redis.tls names is mounted. */}}
{{- define "herald.redisTlsDir" -}}
/etc/herald-redis-tls
{{- end }}

{{/* The Redis URL written to herald.toml (a urlSecret overrides it through
HERALD_REDIS__URL). */}}
{{- define "herald.redisUrl" -}}
{{- if .Values.redis.inChart.enabled }}
{{- printf "redis://%s:%d" (include "herald.redisFullname" .) (int .Values.redis.inChart.port) }}
{{- else if .Values.redis.url }}
{{- .Values.redis.url }}
{{- else }}
{{- "redis://127.0.0.1:6379" }}
{{- end }}
{{- end }}

{{/* "true" when an HPA owns the replica count: autoscaling.enabled true, or
auto with the Redis broker. The memory broker serves one pod, so auto leaves
it alone and true is refused. */}}
{{- define "herald.autoscaling" -}}
{{- $enabled := toString .Values.autoscaling.enabled }}
{{- $shared := eq (include "herald.broker" .) "redis" }}
{{- if eq $enabled "true" }}
{{- if not $shared }}
{{- fail "autoscaling.enabled=true needs a shared broker: set redis.url, redis.urlSecret or redis.inChart.enabled (the memory broker reaches only its own pod's clients, so it runs one pod)" }}
{{- end }}
{{- true }}
{{- else if and (eq $enabled "auto") $shared }}
{{- true }}
{{- end }}
{{- end }}

{{/* Replicas for the Deployment (when no HPA owns the count). */}}
{{- define "herald.replicas" -}}
{{- $shared := eq (include "herald.broker" .) "redis" }}
{{- if kindIs "invalid" .Values.replicaCount }}
{{- if $shared }}3{{ else }}1{{ end }}
{{- else }}
{{- if and (not $shared) (gt (int .Values.replicaCount) 1) }}
{{- fail "replicaCount > 1 needs a shared broker: set redis.url, redis.urlSecret or redis.inChart.enabled (the memory broker reaches only its own pod's clients)" }}
{{- end }}
{{- int .Values.replicaCount }}
{{- end }}
{{- end }}

{{- define "herald.terminationGracePeriodSeconds" -}}
{{- $s := .Values.shutdown }}
{{- $needed := add (int $s.preStopSleepSeconds) (int $s.drainTimeoutSeconds) }}
{{- if kindIs "invalid" $s.terminationGracePeriodSeconds }}
{{- add $needed 5 }}
{{- else }}
{{- if lt (int $s.terminationGracePeriodSeconds) $needed }}
{{- fail (printf "shutdown.terminationGracePeriodSeconds (%d) must cover preStopSleepSeconds + drainTimeoutSeconds (%d), or the drain is cut short" (int $s.terminationGracePeriodSeconds) $needed) }}
{{- end }}
{{- int $s.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/* Whether a Prometheus Operator object is rendered: "auto" follows the
cluster's API versions; true or false decide. */}}
{{- define "herald.monitoringEnabled" -}}
{{- $enabled := index . 0 }}
{{- $root := index . 1 }}
{{- if eq (toString $enabled) "auto" }}
{{- if $root.Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- else if eq (toString $enabled) "true" }}true
{{- end }}
{{- end }}

{{/* herald.toml: the values' `config` with the chart's own keys set, as TOML. */}}
{{- define "herald.config" -}}
{{- $cfg := deepCopy .Values.config }}
{{- $ports := .Values.containerPorts }}
{{- if or (eq (int $ports.http) (int $ports.api)) (eq (int $ports.http) (int $ports.grpc)) (eq (int $ports.api) (int $ports.grpc)) }}
{{- fail (printf "containerPorts.http (%d), .api (%d) and .grpc (%d) must differ: each is its own listener" (int $ports.http) (int $ports.api) (int $ports.grpc)) }}
{{- end }}
{{- $_ := set $cfg "listen" (printf "0.0.0.0:%d" (int .Values.containerPorts.http)) }}
{{- /* The backend API and /metrics on their own port: the clients' port
serves only /ws and the probes. */}}
{{- $http := default dict $cfg.http }}
{{- $_ = set $http "api_listen" (printf "0.0.0.0:%d" (int $ports.api)) }}
{{- $_ = set $cfg "http" $http }}
{{- /* [auth]: what is not secret. The keys come as HERALD_AUTH__* from the
Secret. */}}
{{- $a := .Values.auth }}
{{- $auth := dict "leeway" $a.leeway "allow_anonymous" $a.allowAnonymous }}
{{- with $a.jwksUrl }}
{{- $_ = set $auth "jwks_url" . }}
{{- $_ = set $auth "jwks_refresh_interval" $a.jwksRefreshInterval }}
{{- $_ = set $auth "jwks_min_refetch" $a.jwksMinRefetch }}
{{- end }}
{{- with $a.issuer }}{{ $_ = set $auth "issuer" . }}{{ end }}
{{- with $a.audience }}{{ $_ = set $auth "audience" . }}{{ end }}
{{- $_ = set $cfg "auth" $auth }}
{{- $_ = set $cfg "broker" (include "herald.broker" .) }}
{{- $grpc := default dict $cfg.grpc }}
{{- $_ = set $grpc "listen" (printf "0.0.0.0:%d" (int .Values.containerPorts.grpc)) }}
{{- $_ = set $cfg "grpc" $grpc }}
{{- $_ = set $cfg "shutdown" (dict "drain_timeout" (printf "%ds" (int .Values.shutdown.drainTimeoutSeconds))) }}
{{- $redis := default dict $cfg.redis }}
{{- $_ = set $redis "url" (include "herald.redisUrl" .) }}
{{- $_ = set $redis "prefix" (default .Release.Name .Values.redis.prefix) }}
{{- with .Values.redis.tls }}
{{- if .secretName }}
{{- $dir := include "herald.redisTlsDir" $ }}
{{- $_ = set $redis "tls_ca" (printf "%s/%s" $dir .caKey) }}
{{- if or .certKey .keyKey }}
{{- if not (and .certKey .keyKey) }}
{{- fail "redis.tls.certKey and redis.tls.keyKey go together (a client certificate and its key)" }}
{{- end }}
{{- $_ = set $redis "tls_cert" (printf "%s/%s" $dir .certKey) }}
{{- $_ = set $redis "tls_key" (printf "%s/%s" $dir .keyKey) }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.redis.sentinel }}
{{- if .masterName }}
{{- $_ = set $redis "sentinel" (dict "master_name" .masterName "addresses" .addresses "tls" .tls) }}
{{- end }}
{{- end }}
{{- with .Values.redis.cluster }}
{{- $_ = set $redis "cluster" . }}
{{- end }}
{{- $_ = set $cfg "redis" $redis }}
{{- if and (eq (include "herald.broker" .) "redis") .Values.rebalance.enabled }}
{{- $r := .Values.rebalance }}
{{- $_ = set $cfg "rebalance" (dict "enabled" true "interval" $r.interval "tolerance" $r.tolerance "max_move_fraction" $r.maxMoveFraction) }}
{{- end }}
{{- with .Values.telemetry }}
{{- if .otlpEndpoint }}
{{- $_ = set $cfg "telemetry" (dict "otlp_endpoint" .otlpEndpoint "service_name" .serviceName "sample_ratio" (float64 .sampleRatio)) }}
{{- end }}
{{- end }}
{{- /* [proxy] and [webhooks]: what is set (the webhook secret comes as
HERALD_WEBHOOKS__SECRET from a Secret). */}}
{{- $proxy := dict }}
{{- range $name := list "connect" "refresh" "subscribe" "publish" "rpc" }}
{{- $p := index $.Values.proxy $name }}
{{- if $p.url }}
{{- $endpoint := dict "url" $p.url "timeout" $p.timeout }}
{{- if and (eq $name "connect") $p.headers }}{{ $_ := set $endpoint "headers" $p.headers }}{{ end }}
{{- $_ := set $proxy $name $endpoint }}
{{- end }}
{{- end }}
{{- if $proxy }}
{{- with .Values.proxy.maxInFlight }}{{ $_ := set $proxy "max_in_flight" . }}{{ end }}
{{- with .Values.proxy.maxResponseBytes }}{{ $_ := set $proxy "max_response_bytes" . }}{{ end }}
{{- $_ := set $cfg "proxy" $proxy }}
{{- end }}
{{- with .Values.webhooks }}
{{- if .url }}
{{- if not (include "herald.webhooksSecretName" $) }}
{{- fail "webhooks.url needs a secret: webhooks.existingSecret (and existingSecretKey), or webhooks.secret" }}
{{- end }}
{{- $w := dict "url" .url }}
{{- with .events }}{{ $_ := set $w "events" . }}{{ end }}
{{- with .batchSize }}{{ $_ := set $w "batch_size" . }}{{ end }}
{{- with .batchInterval }}{{ $_ := set $w "batch_interval" . }}{{ end }}
{{- with .queue }}{{ $_ := set $w "queue" . }}{{ end }}
{{- with .timeout }}{{ $_ := set $w "timeout" . }}{{ end }}
{{- with .retryFor }}{{ $_ := set $w "retry_for" . }}{{ end }}
{{- $_ := set $cfg "webhooks" $w }}
{{- end }}
{{- end }}
{{- include "herald.tomlTable" (dict "prefix" "" "table" $cfg) }}
{{- end }}

{{/* The Secret the webhooks' HMAC secret comes from: the user's
(webhooks.existingSecret) or the chart's <fullname>-webhooks. Empty: none. */}}
{{- define "herald.webhooksSecretName" -}}
{{- $w := .Values.webhooks }}
{{- if $w.existingSecret }}
{{- $w.existingSecret }}
{{- else if $w.secret }}
{{- printf "%s-webhooks" (include "herald.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* One TOML table: its plain keys, then each sub-table under its header. */}}
{{- define "herald.tomlTable" -}}
{{- $prefix := .prefix }}
{{- $table := .table }}
{{- range $key := keys $table | sortAlpha }}
{{- $value := index $table $key }}
{{- if not (kindIs "map" $value) }}
{{ include "herald.tomlKey" $key }} = {{ include "herald.tomlValue" $value }}
{{- end }}
{{- end }}
{{- range $key := keys $table | sortAlpha }}
{{- $value := index $table $key }}
{{- if kindIs "map" $value }}
{{- $name := include "herald.tomlKey" $key }}
{{- if $prefix }}{{ $name = printf "%s.%s" $prefix $name }}{{ end }}
{{- /* A table holding only tables needs no header of its own. */}}
{{- $plain := false }}
{{- range $v := values $value }}{{ if not (kindIs "map" $v) }}{{ $plain = true }}{{ end }}{{ end }}
{{- if or $plain (not $value) }}
{{ printf "\n[%s]" $name }}
{{- end }}
{{- include "herald.tomlTable" (dict "prefix" $name "table" $value) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "herald.tomlKey" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . }}{{ . }}{{ else }}{{ toJson . }}{{ end }}
{{- end }}

{{/* A TOML value. Helm reads YAML numbers as floats: whole ones are written
as integers, which herald's integer keys need. JSON strings are valid TOML
basic strings. */}}
{{- define "herald.tomlValue" -}}
{{- if kindIs "string" . }}{{ toJson . }}
{{- else if kindIs "bool" . }}{{ . }}
{{- else if or (kindIs "float64" .) (kindIs "float32" .) }}
{{- if eq (float64 (int64 .)) (float64 .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else if kindIs "slice" . }}[{{ range $i, $v := . }}{{ if $i }}, {{ end }}{{ include "herald.tomlValue" $v }}{{ end }}]
{{- else if kindIs "invalid" . }}{{ fail "herald.toml has no null: remove the key to take herald's default" }}
{{- else }}{{ . }}
{{- end }}
{{- end }}
