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

{{/* Environment both Deployments share: where Kafka is, its credentials, the spec. */}}
{{- define "instanced-stream.env" -}}
- {name: STREAM_SPEC, value: /etc/stream/agent.yaml}
{{- if .Values.kafka.clientSecret }}
{{- if .Values.kafka.sasl.mechanism }}
- name: STREAM_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ .Values.kafka.clientSecret | quote }}, key: password}
{{- end }}
{{- if contains "SSL" .Values.kafka.securityProtocol }}
- {name: STREAM_KAFKA_SSL_CAFILE, value: /etc/kafka-client/ca}
{{- end }}
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
