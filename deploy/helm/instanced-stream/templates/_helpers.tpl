{{/* The release's name for its objects, at most 63 characters. */}}
{{- define "instanced-stream.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "instanced-stream.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Pods of one component: (dict "root" $ "component" "processor") */}}
{{- define "instanced-stream.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The processors' consumer group and input topic, as the processors compute them. */}}
{{- define "instanced-stream.group" -}}
{{- printf "%s%s" .Values.topicPrefix .Values.appId -}}
{{- end -}}
{{- define "instanced-stream.inputTopic" -}}
{{- printf "%s%s" .Values.topicPrefix .Values.inputTopic -}}
{{- end -}}

{{- define "instanced-stream.spec" -}}
{{- .Values.spec | default (.Files.Get "files/agent.yaml") -}}
{{- end -}}

{{/*
The activity worker's handlers: the example's only with the chart's own spec (the worker
refuses handlers for tools its spec does not declare, so your spec with the example's
handlers would crash-loop the workers).
*/}}
{{- define "instanced-stream.activitiesModule" -}}
{{- if .Values.activities.module -}}
{{- .Values.activities.module -}}
{{- else if .Values.spec -}}
{{- fail "activities.module is required with your own spec: the default handlers are the moderation example's; build an image with your handlers and name their module (docs/kubernetes.md), or set activities.enabled=false" -}}
{{- else -}}
/app/examples/moderation/activities.py
{{- end -}}
{{- end -}}

{{- define "instanced-stream.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/*
PromQL label matchers of this release's processors: the PodMonitor copies the pods'
instance and component labels onto every series it scrapes, so a shared Prometheus
with other releases (or other products' metrics of the same name) is not mixed in.
*/}}
{{- define "instanced-stream.series" -}}
{{- printf "namespace=%q, app_kubernetes_io_instance=%q, app_kubernetes_io_component=\"processor\"" .Release.Namespace .Release.Name -}}
{{- end -}}

{{/* The same for this release's activity workers. */}}
{{- define "instanced-stream.workerSeries" -}}
{{- printf "namespace=%q, app_kubernetes_io_instance=%q, app_kubernetes_io_component=\"activities\"" .Release.Namespace .Release.Name -}}
{{- end -}}

{{/* An alert's runbook: its section of docs/operations.md, under runbookBaseUrl. */}}
{{- define "instanced-stream.runbook" -}}
{{- printf "%s/operations.md#%s" (.root.Values.monitoring.prometheusRule.runbookBaseUrl | trimSuffix "/") (lower .alert) -}}
{{- end -}}

{{/* Environment both workloads share: where Kafka is, its credentials, the spec. */}}
{{- define "instanced-stream.env" -}}
{{- $kafka := .Values.kafka }}
- {name: STREAM_SPEC, value: /etc/stream/agent.yaml}
{{- if and $kafka.tls.clientAuth (not $kafka.clientSecret) }}
{{- fail "kafka.clientSecret is required with kafka.tls.clientAuth: the Secret holding the client's cert and key" }}
{{- end }}
{{- if $kafka.clientSecret }}
{{- if and $kafka.sasl.mechanism (ne $kafka.sasl.mechanism "OAUTHBEARER") }}
- name: STREAM_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ $kafka.clientSecret | quote }}, key: password}
{{- end }}
{{- if contains "SSL" $kafka.securityProtocol }}
- {name: STREAM_KAFKA_SSL_CAFILE, value: /etc/kafka-client/ca}
{{- end }}
{{- if $kafka.tls.clientAuth }}
- {name: STREAM_KAFKA_SSL_CERTFILE, value: /etc/kafka-client/cert}
- {name: STREAM_KAFKA_SSL_KEYFILE, value: /etc/kafka-client/key}
{{- end }}
{{- end }}
{{- if eq $kafka.sasl.mechanism "OAUTHBEARER" }}
- {name: STREAM_KAFKA_SASL_OAUTH_TOKEN_FILE, value: {{ $kafka.sasl.oauth.tokenFile | default "/var/run/secrets/kafka-oauth/token" | quote }}}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Volumes both workloads mount: Kafka's client files, OAUTHBEARER's token, extras. */}}
{{- define "instanced-stream.volumes" -}}
{{- $kafka := .Values.kafka }}
{{- if $kafka.clientSecret }}
- name: kafka-client
  secret:
    secretName: {{ $kafka.clientSecret | quote }}
    optional: true
{{- end }}
{{- if and (eq $kafka.sasl.mechanism "OAUTHBEARER") (not $kafka.sasl.oauth.tokenFile) }}
# A token Kubernetes issues for the pod's service account and renews before it expires;
# the clients read the file again at every authentication.
- name: kafka-oauth
  projected:
    sources:
      - serviceAccountToken:
          path: token
          audience: {{ required "kafka.sasl.oauth.audience is required with OAUTHBEARER and no tokenFile: the audience your cluster's token validator expects" $kafka.sasl.oauth.audience | quote }}
          expirationSeconds: {{ $kafka.sasl.oauth.expirationSeconds }}
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "instanced-stream.volumeMounts" -}}
{{- $kafka := .Values.kafka }}
{{- if $kafka.clientSecret }}
- {name: kafka-client, mountPath: /etc/kafka-client, readOnly: true}
{{- end }}
{{- if and (eq $kafka.sasl.mechanism "OAUTHBEARER") (not $kafka.sasl.oauth.tokenFile) }}
- {name: kafka-oauth, mountPath: /var/run/secrets/kafka-oauth, readOnly: true}
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "instanced-stream.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "instanced-stream.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Pod-level values both workloads share: identity, pull secrets, scheduling. */}}
{{- define "instanced-stream.podExtras" -}}
{{- with include "instanced-stream.serviceAccountName" . }}
serviceAccountName: {{ . | quote }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "instanced-stream.podSecurity" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{- define "instanced-stream.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
{{- end -}}
