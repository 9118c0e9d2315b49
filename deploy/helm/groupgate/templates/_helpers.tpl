{{/* The workload's name: workload.name or the release name. */}}
{{- define "groupgate.name" -}}
{{- default .Release.Name .Values.workload.name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object of the chart. */}}
{{- define "groupgate.labels" -}}
app.kubernetes.io/name: {{ include "groupgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: groupgate
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The application's pods: the workload's selector, or podSelector for your own Deployment. */}}
{{- define "groupgate.selector" -}}
{{- if .Values.workload.enabled -}}
app.kubernetes.io/name: {{ include "groupgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- else if .Values.podSelector -}}
{{ toYaml .Values.podSelector }}
{{- else -}}
{{- fail "set podSelector to the labels of your application's pods (or enable workload)" -}}
{{- end -}}
{{- end -}}

{{/* A value as groupgate reads it: integral numbers without an exponent, booleans on/off. */}}
{{- define "groupgate.string" -}}
{{- if kindIs "float64" . -}}
{{- if eq . (floor .) -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- else if kindIs "bool" . -}}
{{- ternary "on" "off" . -}}
{{- else if kindIs "slice" . -}}
{{- join "," . -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}
