{{- define "mm.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "mm.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* A component's labels: (dict "root" . "component" "bot"). */}}
{{- define "mm.componentLabels" -}}
{{ include "mm.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "mm.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "mm.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The Secret every pod reads its secrets from: there is no default to fall back on. */}}
{{- define "mm.existingSecret" -}}
{{- required "existingSecret: name the Secret that holds SLACK_BOT_TOKEN and the other secrets (this chart never creates one)" .Values.existingSecret -}}
{{- end -}}

{{/* The endpoints every mm-bot process gets (the secrets come through mm.envFrom). The migration hook
runs before the release's ConfigMap exists, and migrating needs only DATABASE_URL, so MM_CONFIG is separate.
HOME is /tmp: the root file system is read-only. */}}
{{- define "mm.env" -}}
{{- range $key, $name := dict "databaseUrl" "DATABASE_URL" "brokerUrl" "CELERY_BROKER_URL" }}
{{- if regexMatch "://[^:/@]*:[^@]+@|[?&]password=" (get $.Values $key | default "") }}
{{- fail (printf "%s carries a password, which would sit in every Deployment's spec and in `helm get values`: put the whole URL in existingSecret as %s and leave %s empty" $key $name $key) }}
{{- end }}
{{- end }}
- name: HOME
  value: /tmp
- name: MM_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
{{- with .Values.databaseUrl }}
- name: DATABASE_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.brokerUrl }}
- name: CELERY_BROKER_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.slackApiUrl }}
- name: SLACK_API_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The files `mm-bot probe live|ready` read (workers/heartbeat.py), in the pod's own /tmp. */}}
{{- define "mm.probeEnv" -}}
- name: MM_HEARTBEAT_FILE
  value: /tmp/mm-heartbeat
- name: MM_READY_FILE
  value: /tmp/mm-ready
{{- end -}}

{{/* Workers and the scheduler serve metrics on their own port; the code listens on loopback unless told. */}}
{{- define "mm.metricsEnv" -}}
{{- if .Values.metrics.enabled }}
- name: MM_METRICS_PORT
  value: {{ .Values.metrics.port | quote }}
- name: MM_METRICS_HOST
  value: "0.0.0.0"
{{- end }}
{{- end -}}

{{- define "mm.metricsPort" -}}
{{- if .Values.metrics.enabled }}
ports:
  - name: metrics
    containerPort: {{ .Values.metrics.port }}
{{- end }}
{{- end -}}

{{- define "mm.envFrom" -}}
- secretRef:
    name: {{ include "mm.existingSecret" . }}
{{- end -}}

{{- define "mm.configEnv" -}}
- name: MM_CONFIG
  value: /etc/mm/mm.yaml
{{- end -}}

{{/* Volumes every pod has: the config (not the hook's: its ConfigMap does not exist yet) and /tmp.
(dict "root" . "hook" false) */}}
{{- define "mm.volumes" -}}
{{- if not .hook }}
- name: config
  configMap:
    name: {{ include "mm.fullname" .root }}
{{- end }}
- name: tmp
  emptyDir:
    sizeLimit: {{ .root.Values.tmpSizeLimit }}
{{- end -}}

{{- define "mm.mounts" -}}
- name: config
  mountPath: /etc/mm
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- end -}}

{{- define "mm.containerSecurityContext" -}}
{{- toYaml .Values.containerSecurityContext }}
{{- end -}}

{{/* Pod annotations: the config's checksum (a change rolls the pods) and where Prometheus scrapes.
(dict "root" . "port" 9100) */}}
{{- define "mm.podAnnotations" -}}
checksum/config: {{ .root.Values.config | sha256sum }}
{{- if .root.Values.metrics.enabled }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- with .root.Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Waits until the database's schema is the code's: the migration hook (or an operator) brings it there.
Without it a pod that starts before the hook is done (or with the hook skipped) would run on an old schema. */}}
{{- define "mm.waitForSchema" -}}
{{- if .Values.migrations.waitForSchema }}
initContainers:
  - name: wait-for-schema
    image: {{ include "mm.image" . }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    command: ["sh", "-c", "until mm-bot migrate --check; do sleep 5; done"]
    env:
      {{- include "mm.configEnv" . | nindent 6 }}
      {{- include "mm.env" . | nindent 6 }}
    envFrom:
      {{- include "mm.envFrom" . | nindent 6 }}
    volumeMounts:
      {{- include "mm.mounts" . | nindent 6 }}
    securityContext:
      {{- include "mm.containerSecurityContext" . | nindent 6 }}
    resources:
      {{- toYaml .Values.migrations.resources | nindent 6 }}
{{- end }}
{{- end -}}

{{/* A soft spread of a component's replicas over nodes. (dict "root" . "component" "bot") */}}
{{- define "mm.spread" -}}
{{- if .root.Values.spreadAcrossNodes }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "mm.selector" . | nindent 8 }}
{{- end }}
{{- end -}}

{{- define "mm.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.serviceAccountName }}
serviceAccountName: {{ . }}
{{- end }}
# No process talks to the Kubernetes API.
automountServiceAccountToken: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
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

{{/* Whether the workers can be more than one pod. */}}
{{- define "mm.workersMany" -}}
{{- if .Values.autoscaling.enabled -}}
{{- if gt (int .Values.autoscaling.maxReplicaCount) 1 }}true{{ end -}}
{{- else if gt (int .Values.worker.replicas) 1 }}true{{ end -}}
{{- end -}}
