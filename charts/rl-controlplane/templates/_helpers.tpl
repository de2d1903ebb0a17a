{{/*
Names, labels and the two rendered config files. Everything a template needs twice lives here.
*/}}

{{- define "rlcp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "<release>-<chart>", or the release name alone when it already contains the chart name. */}}
{{- define "rlcp.fullname" -}}
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

{{/* "<fullname>-<suffix>", kept a valid DNS label. Call with (list . "suffix"). */}}
{{- define "rlcp.suffixed" -}}
{{- $root := index . 0 }}
{{- printf "%s-%s" (include "rlcp.fullname" $root | trunc 52 | trimSuffix "-") (index . 1) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rlcp.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rlcp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rlcp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "rlcp.labels" -}}
helm.sh/chart: {{ include "rlcp.chart" . }}
{{ include "rlcp.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rl-controlplane
{{- end }}

{{- define "rlcp.controller.selectorLabels" -}}
{{ include "rlcp.selectorLabels" . }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "rlcp.controller.labels" -}}
{{ include "rlcp.labels" . }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "rlcp.agent.selectorLabels" -}}
{{ include "rlcp.selectorLabels" . }}
app.kubernetes.io/component: agent
{{- end }}

{{- define "rlcp.agent.labels" -}}
{{ include "rlcp.labels" . }}
app.kubernetes.io/component: agent
{{- end }}

{{- define "rlcp.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rlcp.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rlcp.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "rlcp.agent.image" -}}
{{- $img := .Values.agents.image }}
{{- printf "%s:%s" ($img.repository | default .Values.image.repository) ($img.tag | default .Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* The Secret holding each token: the one named in values, or the chart's own. */}}
{{- define "rlcp.apiTokenSecretName" -}}
{{- .Values.api.token.existingSecret | default (include "rlcp.suffixed" (list . "api-token")) }}
{{- end }}

{{- define "rlcp.apiTokenSecretKey" -}}
{{- if .Values.api.token.existingSecret }}{{ .Values.api.token.existingSecretKey }}{{ else }}token{{ end }}
{{- end }}

{{- define "rlcp.workersTokenSecretName" -}}
{{- .Values.workers.token.existingSecret | default (include "rlcp.suffixed" (list . "workers-token")) }}
{{- end }}

{{- define "rlcp.workersTokenSecretKey" -}}
{{- if .Values.workers.token.existingSecret }}{{ .Values.workers.token.existingSecretKey }}{{ else }}token{{ end }}
{{- end }}

{{/*
A chart-made token: the value given, else the one already in the cluster (so an upgrade keeps
it), else a new random one. Call with (list . "secret-name" "given value").
*/}}
{{- define "rlcp.tokenValue" -}}
{{- $root := index . 0 }}
{{- $name := index . 1 }}
{{- $given := index . 2 }}
{{- if $given }}
{{- $given | b64enc }}
{{- else }}
{{- $existing := lookup "v1" "Secret" $root.Release.Namespace $name }}
{{- if and $existing $existing.data (hasKey $existing.data "token") }}
{{- index $existing.data "token" }}
{{- else }}
{{- randAlphaNum 48 | b64enc }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rlcp.leaseName" -}}
{{- .Values.leaderElection.leaseName | default (include "rlcp.suffixed" (list . "leader")) }}
{{- end }}

{{- define "rlcp.storeConfigMapName" -}}
{{- .Values.store.configMapName | default (include "rlcp.suffixed" (list . "state")) }}
{{- end }}

{{- define "rlcp.agentsServiceName" -}}
{{- include "rlcp.suffixed" (list . "agents") }}
{{- end }}

{{/* The agents' StatefulSet: pod names add "-<ordinal>" and a revision-hash label must fit 63. */}}
{{- define "rlcp.agentsStatefulSetName" -}}
{{- printf "%s-agent" (include "rlcp.fullname" . | trunc 46 | trimSuffix "-") }}
{{- end }}

{{- define "rlcp.discoveryNamespace" -}}
{{- .Values.discovery.kubernetes.namespace | default .Release.Namespace }}
{{- end }}

{{- define "rlcp.discoveryLabelSelector" -}}
{{- .Values.discovery.kubernetes.labelSelector | default (printf "kubernetes.io/service-name=%s" (include "rlcp.agentsServiceName" .)) }}
{{- end }}

{{- define "rlcp.tokenDir" -}}/var/run/secrets/rl-controlplane{{- end }}
{{- define "rlcp.configDir" -}}/etc/rl-controlplane{{- end }}

{{/*
The controller's config.yaml (controlplane/settings/ names). What only the pod knows (its
name and namespace) comes from the downward API as RLCP_* variables, which override the file.
*/}}
{{- define "rlcp.controller.config" -}}
{{- $v := .Values }}
{{- $cfg := dict
  "controller_id" ($v.controllerId | default (include "rlcp.fullname" .))
  "api" (dict "host" $v.api.host "port" (int $v.api.port) "auth_reads" $v.api.authReads
              "allow_anonymous" $v.api.allowAnonymous
              "token_file" (printf "%s/api/token" (include "rlcp.tokenDir" .)))
  "workers" (dict "max_concurrency" (int $v.workers.maxConcurrency)
                  "token_file" (printf "%s/workers/token" (include "rlcp.tokenDir" .)))
  "gateway" (dict "enabled" (and $v.gateway.enabled (eq (int $v.gateway.replicas) 0)) "host" "0.0.0.0"
                  "port" (int $v.gateway.port) "hold_timeout_s" $v.gateway.holdTimeoutS
                  "follow_url" (printf "http://%s:%d" (include "rlcp.fullname" .) (int $v.service.port)))
  "store" (dict "kind" $v.store.kind)
  "allowed_roots" (default list $v.allowedRoots)
  "log_format" $v.log.format
  "log_level" $v.log.level }}
{{- if eq $v.store.kind "configmap" }}
{{- $_ := set $cfg.store "configmap_name" (include "rlcp.storeConfigMapName" .) }}
{{- end }}
{{- if $v.fleets }}
{{- $_ := set $cfg "fleets" $v.fleets }}
{{- end }}
{{- if eq $v.gateway.dataPlane "envoy" }}
{{- /* The controller serves the Envoy pods the fence over xDS, in place of its own gateway. */}}
{{- $_ := set $cfg.gateway "data_plane" "envoy" }}
{{- $_ := set $cfg.gateway "envoy" (dict "xds_host" "0.0.0.0" "xds_port" (int $v.gateway.envoy.xdsPort)
                                         "listen_port" (int $v.gateway.envoy.listenPort)) }}
{{- end }}
{{- $d := $v.discovery }}
{{- if eq $d.kind "kubernetes" }}
{{- $k := dict "label_selector" (include "rlcp.discoveryLabelSelector" .)
               "admin_port_name" $d.kubernetes.adminPortName
               "inference_port_name" $d.kubernetes.inferencePortName
               "world_size_key" $d.kubernetes.worldSizeKey
               "read_pods" $d.kubernetes.readPods }}
{{- if $d.kubernetes.namespace }}
{{- $_ := set $k "namespace" $d.kubernetes.namespace }}
{{- end }}
{{- $_ := set $cfg "discovery" (dict "kind" "kubernetes" "kubernetes" $k) }}
{{- else if eq $d.kind "static" }}
{{- $_ := set $cfg "discovery" (dict "kind" "static" "static" $d.static) }}
{{- else if eq $d.kind "ray" }}
{{- $_ := set $cfg "discovery" (dict "kind" "ray" "ray" $d.ray) }}
{{- else }}
{{- $_ := set $cfg "discovery" (dict "kind" "http_listing" "http_listing" $d.httpListing) }}
{{- end }}
{{- if eq $v.placement.kind "ray" }}
{{- $_ := set $cfg "placement" (dict "kind" "ray" "ray" $v.placement.ray) }}
{{- end }}
{{- if $v.leaderElection.enabled }}
{{- $_ := set $cfg "leader_election" (dict "enabled" true "lease_name" (include "rlcp.leaseName" .)) }}
{{- end }}
{{- toYaml (mergeOverwrite $cfg (deepCopy $v.extraConfig)) }}
{{- end }}

{{/* The example agents' config.yaml (agents/settings.py names). */}}
{{- define "rlcp.agent.config" -}}
{{- $a := .Values.agents }}
{{- $engine := dict
  "kind" "vllm"
  "model" $a.engine.model
  "tensor_parallel_size" (int $a.engine.tensorParallelSize)
  "gpu_memory_utilization" $a.engine.gpuMemoryUtilization
  "extra_engine_args" $a.engine.extraEngineArgs }}
{{- if $a.engine.servedModelName }}
{{- $_ := set $engine "served_model_name" $a.engine.servedModelName }}
{{- end }}
{{- if $a.engine.maxModelLen }}
{{- $_ := set $engine "max_model_len" (int $a.engine.maxModelLen) }}
{{- end }}
{{- $cfg := dict
  "admin" (dict "host" "0.0.0.0" "port" (int $a.adminPort)
                "token_file" (printf "%s/workers/token" (include "rlcp.tokenDir" .)))
  "inference" (dict "host" "0.0.0.0" "port" (int $a.inferencePort))
  "engine" $engine
  "allowed_roots" ($a.allowedRoots | default (list $a.weights.mountPath))
  "require_desired_version" true
  "log_format" .Values.log.format
  "log_level" .Values.log.level }}
{{- toYaml (mergeOverwrite $cfg (deepCopy $a.extraConfig)) }}
{{- end }}

{{/* The GPU count of one agent pod: resources' own limit if set, else the tensor-parallel size. */}}
{{- define "rlcp.agent.resources" -}}
{{- $a := .Values.agents }}
{{- $res := deepCopy $a.resources }}
{{- $limits := $res.limits | default dict }}
{{- if not (hasKey $limits $a.gpuResourceName) }}
{{- $_ := set $limits $a.gpuResourceName (int $a.engine.tensorParallelSize) }}
{{- end }}
{{- $_ := set $res "limits" $limits }}
{{- toYaml $res }}
{{- end }}

{{/* Rules values.schema.json cannot say. */}}
{{- define "rlcp.validate" -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) }}
{{- fail "replicas > 1 needs leaderElection.enabled=true: two controllers would both drive the fleet" }}
{{- end }}
{{- if and .Values.agents.enabled (not .Values.agents.weights.claimName) }}
{{- fail "agents.enabled needs agents.weights.claimName: a PersistentVolumeClaim with the model and the trainer's checkpoints" }}
{{- end }}
{{- if and .Values.agents.enabled (ne .Values.discovery.kind "kubernetes") }}
{{- fail "agents.enabled needs discovery.kind=kubernetes: the controller finds the example agents through their EndpointSlices" }}
{{- end }}
{{- if and (eq .Values.discovery.kind "static") (not .Values.discovery.static) }}
{{- fail "discovery.kind=static needs discovery.static: a list of {id, admin_url, inference_url, flavor}" }}
{{- end }}
{{- if and (eq .Values.discovery.kind "ray") (not .Values.discovery.ray.dashboard_url) }}
{{- fail "discovery.kind=ray needs discovery.ray.dashboard_url (the Ray head service's dashboard, :8265)" }}
{{- end }}
{{- if and (eq .Values.placement.kind "ray") (not .Values.placement.ray.address) }}
{{- fail "placement.kind=ray needs placement.ray.address (the Ray head service's GCS, <head-svc>:6379)" }}
{{- end }}
{{- if and (eq .Values.gateway.dataPlane "envoy") (gt (int .Values.replicas) 1) }}
{{- fail "gateway.dataPlane=envoy needs replicas: 1: every controller replica would serve xDS, and Envoy must follow the one that drives the fleet" }}
{{- end }}
{{- if and (eq .Values.gateway.dataPlane "envoy") (gt (int .Values.gateway.replicas) 0) }}
{{- fail "gateway.dataPlane=envoy runs Envoy pods (gateway.envoy.replicas) in place of the Python gateway: set gateway.replicas: 0" }}
{{- end }}
{{- if and (eq .Values.gateway.dataPlane "envoy") (not .Values.gateway.enabled) }}
{{- fail "gateway.dataPlane=envoy needs gateway.enabled=true" }}
{{- end }}
{{- if and (eq .Values.discovery.kind "http_listing") (not .Values.discovery.httpListing.url) }}
{{- fail "discovery.kind=http_listing needs discovery.httpListing.url" }}
{{- end }}
{{- end }}

{{/* The Role rules of EndpointSlice discovery, in the namespace it watches. */}}
{{- define "rlcp.discoveryRules" -}}
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
{{- if .Values.discovery.kubernetes.readPods }}
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get"]
{{- end }}
{{- end }}

{{/* Does the controller talk to the Kubernetes API at all? */}}
{{- define "rlcp.usesKubeApi" -}}
{{- if or (eq .Values.discovery.kind "kubernetes") .Values.leaderElection.enabled (eq .Values.store.kind "configmap") }}true{{ end }}
{{- end }}
