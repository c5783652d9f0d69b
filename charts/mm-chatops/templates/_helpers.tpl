{{- define "mm.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
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

{{- define "mm.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "mm.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The endpoints every mm-bot process gets (the secrets come through mm.envFrom). The migration hook
runs before the release's ConfigMap exists, and migrating needs only DATABASE_URL, so MM_CONFIG is separate. */}}
{{- define "mm.env" -}}
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

{{- define "mm.envFrom" -}}
- secretRef:
    name: {{ .Values.existingSecret }}
{{- end -}}

{{- define "mm.configEnv" -}}
- name: MM_CONFIG
  value: /etc/mm/mm.yaml
{{- end -}}

{{- define "mm.configVolume" -}}
- name: config
  configMap:
    name: {{ include "mm.fullname" . }}
{{- end -}}

{{- define "mm.configMount" -}}
- name: config
  mountPath: /etc/mm
  readOnly: true
{{- end -}}

{{- define "mm.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
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
