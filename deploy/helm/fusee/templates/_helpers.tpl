{{/* The release's base name: the chart's name, prefixed by the release's unless it holds it. */}}
{{- define "fusee.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "fusee.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fusee.labels" -}}
{{ include "fusee.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "fusee.secretName" -}}
{{- .Values.existingSecret | default (printf "%s-token" (include "fusee.fullname" .)) -}}
{{- end -}}

{{- define "fusee.secretKey" -}}
{{- if .Values.existingSecret -}}{{ .Values.existingSecretKey }}{{- else -}}token{{- end -}}
{{- end -}}

{{/*
The token, base64: the one given, else the one this release's Secret already holds (so an
upgrade keeps it, and the workers holding it stay connected), else a new random one.
`lookup` answers nothing under `helm template` and --dry-run: a token is generated then.
*/}}
{{- define "fusee.token" -}}
{{- if .Values.token -}}
{{- if lt (len .Values.token) 16 -}}
{{- fail "token: at least 16 bytes (openssl rand -hex 32)" -}}
{{- end -}}
{{- .Values.token | b64enc -}}
{{- else -}}
{{- $found := lookup "v1" "Secret" .Release.Namespace (include "fusee.secretName" .) -}}
{{- if and $found $found.data (index $found.data "token") -}}
{{- index $found.data "token" -}}
{{- else -}}
{{- randAlphaNum 64 | b64enc -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* What exists today is one server on a disk; anything else stops the rendering. */}}
{{- define "fusee.checkStore" -}}
{{- if eq .Values.store "postgres" -}}
{{- fail "store: postgres runs several servers on a shared PostgreSQL store, which is not built yet; use store: disk (one server on a persistent volume)" -}}
{{- else if ne .Values.store "disk" -}}
{{- fail (printf "store: %q is not a store; disk is the one that exists (postgres is not built yet)" .Values.store) -}}
{{- end -}}
{{- end -}}
