{{- define "oci-provider.name" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "oci-provider.labels" -}}
app.kubernetes.io/name: oci-secrets-store-csi-driver-provider
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "oci-provider.selector" -}}
app.kubernetes.io/name: oci-secrets-store-csi-driver-provider
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
