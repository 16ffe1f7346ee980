{{/* Names, labels, images and the security settings every kcm pod shares. */}}

{{- define "kcm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kcm.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "<fullname>-<component>", kept within the 63 characters of a DNS label. */}}
{{- define "kcm.componentName" -}}
{{- printf "%s-%s" (include "kcm.fullname" .root | trunc (int (sub 62 (len .component))) | trimSuffix "-") .component -}}
{{- end -}}

{{/* The ScheduledSparkApplication's name, at most 43 characters: the Spark operator names each run
     "<name>-<19-digit UnixNano>" and puts that in a label value, which may hold 63. */}}
{{- define "kcm.rollupAppName" -}}
{{- printf "%s-rollup" (include "kcm.fullname" . | trunc 36 | trimSuffix "-") -}}
{{- end -}}

{{/* "true" when the Prometheus Operator's API is served: `helm install` lists both the group/version and each
     group/version/kind, `helm template --api-versions` whichever is given. */}}
{{- define "kcm.serviceMonitorApi" -}}
{{- if or (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor") -}}
true
{{- end -}}
{{- end -}}

{{/* "true" when the PrometheusRule kind is served: by kind only, since a cluster may serve monitoring.coreos.com/v1
     with the ServiceMonitor CRD alone (an OpenTelemetry target allocator's). */}}
{{- define "kcm.prometheusRuleApi" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PrometheusRule" -}}
true
{{- end -}}
{{- end -}}

{{- define "kcm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kcm.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "kcm.ownLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kcm.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: kafka-client-metrics
{{- end -}}

{{/* Fails the render when extra labels (commonLabels, <component>.podLabels) name one the chart sets itself: a
     second key of one name, and selectors and Services that no longer find their pods. Call with
     (dict "ctx" $ctx "labels" <map> "value" "<its name in the values>"). */}}
{{- define "kcm.labelsLeaveTheChartsOwn" -}}
{{- $own := include "kcm.ownLabels" .ctx | fromYaml -}}
{{- range $key, $_ := .labels | default dict -}}
{{- if hasKey $own $key -}}
{{- fail (printf "%s sets %s, a label the chart sets itself (selectors, Services and budgets find the pods by the app.kubernetes.io/name, instance and component labels): use a key of your own" $.value $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kcm.labels" -}}
{{- include "kcm.labelsLeaveTheChartsOwn" (dict "ctx" . "labels" .root.Values.commonLabels "value" "commonLabels") -}}
{{ include "kcm.ownLabels" . }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* A pod's labels: the chart's, commonLabels, and <component>.podLabels, which win over commonLabels. */}}
{{- define "kcm.podLabels" -}}
{{- $podLabels := (index .root.Values .component).podLabels | default dict -}}
{{- $value := printf "%s.podLabels" .component -}}
{{- include "kcm.labelsLeaveTheChartsOwn" (dict "ctx" . "labels" $podLabels "value" $value) -}}
{{- toYaml (merge (dict) $podLabels (include "kcm.labels" . | fromYaml)) -}}
{{- end -}}

{{/* An image reference: repository:tag, or repository@digest when a digest is given. */}}
{{- define "kcm.imageRef" -}}
{{- if eq .image.tag "latest" -}}
{{- fail (printf "image tag of %s is \"latest\": set a release tag or a digest, so an upgrade or rollback runs a known image" .image.repository) -}}
{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "kcm.serviceAccountName" -}}
{{- $values := index .root.Values .component -}}
{{- if $values.serviceAccount.create -}}
{{- default (include "kcm.componentName" .) $values.serviceAccount.name -}}
{{- else -}}
{{- default "default" $values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Pod-level security: never root, the runtime's default seccomp profile. */}}
{{- define "kcm.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Container-level security: read-only root, no privilege escalation, no capabilities. */}}
{{- define "kcm.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Every spelling of a loopback address: 127.x, ::1 with its zeros written out or as ::0.0.0.1, IPv4-mapped 127.x,
     with or without a zone. Neither operator.listenAddress nor bridge.config.metrics_host may be one: the kubelet
     probes the pod's IP. */}}
{{- define "kcm.loopbackPattern" -}}
^(127\.|((0{1,4}:){7}|(0{1,4}(:0{1,4})*)?::(0{1,4}:)*)0{0,3}1(%.*)?$|((0{1,4}:){6}|(0{1,4}(:0{1,4})*)?::(0{1,4}:)*)0{1,3}\.0{1,3}\.0{1,3}\.0{0,2}1(%.*)?$|((0{1,4}:){5}|(0{1,4}(:0{1,4})*)?::(0{1,4}:)*)[fF]{4}:(127\.[0-9.]*|7[fF][0-9a-fA-F]{2}:[0-9a-fA-F]{1,4})(%.*)?$)
{{- end -}}

{{/* Kafka connection flags shared by every kcm command. */}}
{{- define "kcm.kafkaArgs" -}}
- --bootstrap-server={{ .Values.kafka.bootstrapServers }}
{{- if .Values.kafka.clientConfig.existingSecret }}
- --command-config=/etc/kcm/kafka/client/{{ .Values.kafka.clientConfig.key }}
{{- end }}
{{- end -}}

{{/* Volumes holding the Kafka client config and TLS material, mounted read-only. */}}
{{- define "kcm.kafkaVolumes" -}}
{{- if has "client" .Values.kafka.tlsSecrets }}
{{- fail "kafka.tlsSecrets names a Secret \"client\": /etc/kcm/kafka/client/ is where kafka.clientConfig's properties file is mounted; copy that Secret under another name and list that" }}
{{- end }}
{{- if .Values.kafka.clientConfig.existingSecret }}
- name: kafka-client-config
  secret:
    secretName: {{ .Values.kafka.clientConfig.existingSecret }}
    items:
      - key: {{ .Values.kafka.clientConfig.key }}
        path: {{ .Values.kafka.clientConfig.key }}
{{- end }}
{{- range .Values.kafka.tlsSecrets }}
- name: kafka-tls-{{ . }}
  secret:
    secretName: {{ . }}
{{- end }}
{{- end -}}

{{- define "kcm.kafkaVolumeMounts" -}}
{{- if .Values.kafka.clientConfig.existingSecret }}
- name: kafka-client-config
  mountPath: /etc/kcm/kafka/client
  readOnly: true
{{- end }}
{{- range .Values.kafka.tlsSecrets }}
- name: kafka-tls-{{ . }}
  mountPath: /etc/kcm/kafka/{{ . }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* The namespaces the operator watches in namespaced mode. */}}
{{- define "kcm.watchedNamespaces" -}}
{{- if .Values.operator.watch.namespaces -}}
{{- toYaml (uniq .Values.operator.watch.namespaces) -}}
{{- else -}}
{{- toYaml (list .Release.Namespace) -}}
{{- end -}}
{{- end -}}

{{/* The namespaces whose Secrets the operator may read (see operator.rbac.secrets). */}}
{{- define "kcm.secretNamespaces" -}}
{{- if .Values.operator.rbac.secrets.namespaces -}}
{{- toYaml (uniq .Values.operator.rbac.secrets.namespaces) -}}
{{- else if .Values.operator.watch.allNamespaces -}}
{{- toYaml (list .Release.Namespace) -}}
{{- else -}}
{{- include "kcm.watchedNamespaces" . -}}
{{- end -}}
{{- end -}}

{{/* The operator's rules in every namespace it reconciles. */}}
{{- define "kcm.operatorRules" -}}
# The resources it reconciles: kopf reads, watches and patches them (finalizers, annotations, status).
- apiGroups: ["kcm.dev"]
  resources: ["clientmetricssubscriptions"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["kcm.dev"]
  resources: ["clientmetricssubscriptions/status"]
  verbs: ["patch"]
- apiGroups: ["kcm.dev"]
  resources: ["clientmetricssubscriptions/finalizers"]
  verbs: ["update"]
# KafkaConnections: read when a subscription's spec.connection names one, watched so that one no subscription names
# says so; their status says what the operator found through them.
- apiGroups: ["kcm.dev"]
  resources: ["kafkaconnections"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["kcm.dev"]
  resources: ["kafkaconnections/status"]
  verbs: ["patch"]
# Applied / failed / drift events on those resources (kopf only posts core/v1 Events).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end -}}

{{/* Fails the render when bridge.config holds a credential inline: the config is a ConfigMap, readable by anyone
     who can list ConfigMaps. The message names the key and the Secret-backed way to give it. */}}
{{/*
rollup.extraArgs come after the flags the chart gives `kcm rollup`, which refuses an option given twice: one of those
fails the render, naming the value to set instead.
*/}}
{{- define "kcm.rollupArgsAreExtra" -}}
{{- $owned := dict "--bootstrap-server" "kafka.bootstrapServers" "--command-config" "kafka.clientConfig" "--topic" "kafka.metricsTopic" "--last" "rollup.last" "--resolution" "rollup.resolution" "--log-format" "rollup.logFormat" "--output" "rollup.output" -}}
{{- range $i, $arg := .Values.rollup.extraArgs | default list -}}
{{- $flag := regexReplaceAll "=.*$" (toString $arg) "" -}}
{{- if hasKey $owned $flag -}}
{{- fail (printf "rollup.extraArgs[%d] gives %s, which the chart already passes (kcm rollup refuses an option given twice): set %s instead" $i $flag (get $owned $flag)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
rollup.sparkConf sits in plain text in the ScheduledSparkApplication (and every SparkApplication and spark-submit
command line it makes): a key that names a credential fails the render, naming the key, never its value; keys that
only name a provider class, a file or a switch pass.
*/}}
{{- define "kcm.rollupConfHasNoCredentials" -}}
{{- range $key, $_ := .Values.rollup.sparkConf | default dict -}}
{{- /* a "key" or "sas" part names a key (S3 SSE-C, GCS CSEK encryption keys) or an Azure SAS token */ -}}
{{- $names := regexMatch "(?i)(secret|passw|token|credential|jaas|access\\.key|account\\.key|private\\.key|signature|(^|\\.)(key|sas)(\\.|$))" $key -}}
{{- /* what only names a class, a file or a switch: a credentials provider, a token file */ -}}
{{- $refers := regexMatch "(?i)(providers?|class|type|enabled|file|path|location)$" $key -}}
{{- /* Spark's own references to a Secret (an environment variable from one of its keys, or it mounted): names */ -}}
{{- $refers = or $refers (regexMatch "^spark\\.kubernetes\\.(driver|executor)\\.(secretKeyRef|secrets)\\." $key) -}}
{{- if and $names (not $refers) -}}
{{- fail (printf "rollup.sparkConf.%s would put a credential into the ScheduledSparkApplication: give it through rollup.env with valueFrom.secretKeyRef (for S3, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), or use workload identity" $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
An env entry with a literal value sits in plain text in its Deployment or ScheduledSparkApplication: one whose name
names a credential, or that a bridge.config headers_from_env or salt_env reads, fails the render, naming it, never
its value. Call with (dict "root" . "component" "bridge").
*/}}
{{- define "kcm.envHasNoCredentials" -}}
{{- $component := .component -}}
{{- $read := list -}}
{{- if eq $component "bridge" -}}
{{- $config := .root.Values.bridge.config | default dict -}}
{{- range $endpoint := (get $config "endpoints" | default list) -}}
{{- if kindIs "map" $endpoint -}}{{- $read = concat $read (values (get $endpoint "headers_from_env" | default dict)) -}}{{- end -}}
{{- end -}}
{{- range $rule := (get (get $config "enrich" | default dict) "rules" | default list) -}}
{{- if and (kindIs "map" $rule) (get $rule "salt_env") -}}{{- $read = append $read (get $rule "salt_env") -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- range $i, $entry := (index .root.Values $component).env | default list -}}
{{- if hasKey $entry "value" -}}
{{- $names := regexMatch "(?i)(secret|passw|token|credential|jaas|signature|dsn|(^|_)(api_?)?key$|(^|_)sas(_|$))" $entry.name -}}
{{- /* what names a file, a directory or an id: a key file's path (GOOGLE_APPLICATION_CREDENTIALS), a token file */ -}}
{{- $refers := regexMatch "(?i)((_ID|_FILE|_PATH|_LOCATION|_DIR)$|^GOOGLE_APPLICATION_CREDENTIALS$)" $entry.name -}}
{{- if or (and $names (not $refers)) (has $entry.name $read) -}}
{{- fail (printf "%s.env[%d] (%s) would put a credential into the %s's manifest in plain text: use valueFrom.secretKeyRef" $component $i $entry.name $component) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Each name in <component>.env once, and none the chart sets itself (`owned`: name → what the chart sets it to):
     Kubernetes keeps the last of a repeated name, and Helm 4's server-side apply refuses the manifest ("duplicate
     entries for key [name=…]") with an API error instead of a word about the values. */}}
{{- define "kcm.envNamesOnce" -}}
{{- $component := .component -}}
{{- $owned := .owned | default dict -}}
{{- $seen := dict -}}
{{- range $i, $entry := (index .root.Values $component).env | default list -}}
{{- if hasKey $owned $entry.name -}}
{{- fail (printf "%s.env[%d] gives %s, which the chart sets %s" $component $i $entry.name (get $owned $entry.name)) -}}
{{- end -}}
{{- if hasKey $seen $entry.name -}}
{{- fail (printf "%s.env[%d] gives %s again (so does %s.env[%v]): give each name once" $component $i $entry.name $component (get $seen $entry.name)) -}}
{{- end -}}
{{- $_ := set $seen $entry.name $i -}}
{{- end -}}
{{- end -}}

{{/* bridge.config.kafka.properties at any depth (an unescaped --set makes sasl.password a map in a map): a key
     whose dotted name is credential-like fails, naming it, never its value. */}}
{{- define "kcm.propertiesHaveNoCredentials" -}}
{{- range $key, $value := .properties -}}
{{- $name := printf "%s%s" $.prefix $key -}}
{{- if regexMatch "(?i)(password|secret|jaas|ssl\\.key\\.pem|keystore\\.key|oauthbearer\\.config)" $name -}}
{{- fail (printf "bridge.config.kafka.properties.%s would put a credential into a ConfigMap: put the client properties in a Secret and set kafka.clientConfig.existingSecret" $name) -}}
{{- end -}}
{{- if kindIs "map" $value -}}
{{- include "kcm.propertiesHaveNoCredentials" (dict "properties" $value "prefix" (printf "%s." $name)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kcm.bridgeConfigHasNoCredentials" -}}
{{- $config := .Values.bridge.config | default dict -}}
{{- $kafka := get $config "kafka" | default dict -}}
{{- $properties := dict -}}
{{- if kindIs "map" $kafka -}}{{- $properties = get $kafka "properties" | default dict -}}{{- end -}}
{{- if kindIs "map" $properties -}}
{{- include "kcm.propertiesHaveNoCredentials" (dict "properties" $properties "prefix" "") -}}
{{- range $key, $value := $properties -}}
{{- if or (kindIs "map" $value) (kindIs "slice" $value) -}}
{{- fail (printf "bridge.config.kafka.properties.%s is not a string: client properties are flat, a dotted name is one key; with --set, escape its dots (--set 'bridge.config.kafka.properties.sasl\\.mechanism=SCRAM-SHA-512')" $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $enrich := get $config "enrich" | default dict -}}
{{- $static := dict -}}
{{- if kindIs "map" $enrich -}}{{- $static = get $enrich "static_attributes" | default dict -}}{{- end -}}
{{- if kindIs "map" $static -}}
{{- range $key, $value := $static -}}
{{- if or (kindIs "map" $value) (kindIs "slice" $value) -}}
{{- fail (printf "bridge.config.enrich.static_attributes.%s is not a string: attribute names are flat, a dotted name is one key; with --set, escape its dots (--set 'bridge.config.enrich.static_attributes.kafka\\.cluster\\.name=prod-eu-1')" $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $endpoints := get $config "endpoints" | default list -}}
{{- if kindIs "slice" $endpoints -}}
{{- range $i, $endpoint := $endpoints -}}
{{- $headers := dict -}}
{{- if kindIs "map" $endpoint -}}{{- $headers = get $endpoint "headers" | default dict -}}{{- end -}}
{{- if kindIs "map" $headers -}}
{{- range $name, $value := $headers -}}
{{- if regexMatch "(?i)(auth|token|key|secret|passw|cookie|signature|credential|team|dsn)" $name -}}
{{- fail (printf "bridge.config.endpoints[%d].headers.%s would put a credential into a ConfigMap: use headers_from_files with a Secret in bridge.secretMounts, or headers_from_env with bridge.env valueFrom.secretKeyRef" $i $name) -}}
{{- end -}}
{{- if not (kindIs "string" $value) -}}
{{- fail (printf "bridge.config.endpoints[%d].headers.%s must be a quoted string (Helm reads an unquoted one as a number or true/false, and renders it re-typed)" $i $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $enrich := get $config "enrich" | default dict -}}
{{- $rules := list -}}
{{- if kindIs "map" $enrich -}}{{- $rules = get $enrich "rules" | default list -}}{{- end -}}
{{- if kindIs "slice" $rules -}}
{{- range $i, $rule := $rules -}}
{{- if and (kindIs "map" $rule) (get $rule "salt") -}}
{{- fail (printf "bridge.config.enrich.rules[%d].salt would put the hashing salt into a ConfigMap: use salt_file with a Secret in bridge.secretMounts, or salt_env with bridge.env valueFrom.secretKeyRef" $i) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
