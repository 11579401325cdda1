{{/* Object names: at most 63 characters (label values and DNS names). */}}
{{- define "inferencepool-operator.fullname" -}}
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

{{- define "inferencepool-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "inferencepool-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Deployment's selector: immutable, so only labels that never change between upgrades. */}}
{{- define "inferencepool-operator.selectorLabels" -}}
app.kubernetes.io/name: inferencepool
app.kubernetes.io/component: operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "inferencepool-operator.labels" -}}
{{ include "inferencepool-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Flags after the image's entrypoint (`inferencepool operator --liveness http://0.0.0.0:8080/healthz`). */}}
{{- define "inferencepool-operator.args" -}}
{{- $args := list -}}
{{- range .Values.watchNamespaces -}}
{{- $args = append $args (printf "--namespace=%s" .) -}}
{{- end -}}
{{- if eq .Values.logLevel "debug" -}}
{{- $args = append $args "--verbose" -}}
{{- end -}}
{{- $args = concat $args .Values.extraArgs -}}
{{- if $args -}}
{{- toYaml $args -}}
{{- end -}}
{{- end -}}
