{{/*
Names are the Go chart's (the DaemonSet is the chart's name, the ServiceAccount
"<name>-sa", the same selector), so `helm upgrade` from the Go chart to this one updates
the objects in place instead of failing on an immutable selector.
*/}}
{{- define "oci-provider.name" -}}
{{- .Chart.Name | trunc 60 | trimSuffix "-" -}}
{{- end -}}

{{- define "oci-provider.serviceAccount" -}}
{{- printf "%s-sa" (include "oci-provider.name" .) -}}
{{- end -}}

{{- define "oci-provider.selector" -}}
app.kubernetes.io/name: {{ include "oci-provider.name" . }}
{{- end -}}

{{- define "oci-provider.labels" -}}
{{ include "oci-provider.selector" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* repository:tag; with provider.image.digest, repository:tag@digest (pulled by the
    digest, the tag saying which release it is); else, when repository:tag is the chart's
    own image, the digest `cargo xtask release` pinned in Chart.yaml's annotation. */}}
{{- define "oci-provider.image" -}}
{{- $image := .Values.provider.image -}}
{{- $reference := printf "%s:%s" $image.repository ($image.tag | default .Chart.AppVersion) -}}
{{- $pinned := index (.Chart.Annotations | default dict) "oci-vault-csi.github.io/image" | default "" -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $reference $image.digest -}}
{{- else if and (contains "@" $pinned) (eq $reference (first (splitList "@" $pinned))) -}}
{{- $pinned -}}
{{- else -}}
{{- $reference -}}
{{- end -}}
{{- end -}}

{{/* The container directory of the socket named by provider.endpoint. */}}
{{- define "oci-provider.socketDir" -}}
{{- $endpoint := .Values.provider.endpoint -}}
{{- if not (hasPrefix "unix://" $endpoint) -}}
{{- fail (printf "provider.endpoint %q: the driver reaches providers over a Unix socket (unix:///dir/name.sock)" $endpoint) -}}
{{- end -}}
{{- dir (trimPrefix "unix://" $endpoint) -}}
{{- end -}}

{{/*
Workload identity's region (OCI_RESOURCE_PRINCIPAL_REGION), required while workload is
enabled: no default, since a wrong one sends every mount (the instance principal's too) to
another region's vaults. Fails naming the value, an example and where to find it.
*/}}
{{- define "oci-provider.region" -}}
{{- $workload := .Values.provider.oci.auth.types.workload -}}
{{- if and $workload.enabled (not $workload.resourcePrincipalRegion) -}}
{{- fail "provider.oci.auth.types.workload.resourcePrincipalRegion is required while workload identity is enabled: the cluster's OCI region, e.g. --set provider.oci.auth.types.workload.resourcePrincipalRegion=us-ashburn-1 (or its short code, iad). On OKE it is the region in the cluster's OCID (ocid1.cluster.oc1.<region>.…), or `kubectl get nodes -L topology.kubernetes.io/region`. Not using authType: workload? Set provider.oci.auth.types.workload.enabled=false" -}}
{{- end -}}
{{- $workload.resourcePrincipalRegion -}}
{{- end -}}

{{/* The audience of the service-account tokens the provider expects: the federation's,
    else "" (the API server's default, the provider's auth.workload_audience default). */}}
{{- define "oci-provider.audience" -}}
{{- $workload := .Values.provider.oci.auth.types.workload -}}
{{- if and $workload.enabled $workload.federation.enabled -}}{{ $workload.federation.audience }}{{- end -}}
{{- end -}}

{{/*
With workload identity, the bundled driver and no TokenRequest fallback, the driver's
tokenRequests must hold the provider's audience, or no mount would have a token: fails
naming what to add. (A driver installed separately is the operator's: NOTES.txt says.)
*/}}
{{- define "oci-provider.checkTokens" -}}
{{- $workload := .Values.provider.oci.auth.types.workload -}}
{{- $driver := index .Values "secrets-store-csi-driver" -}}
{{- if and $workload.enabled $driver.install (not $workload.tokenRequest) -}}
{{- $audience := include "oci-provider.audience" . -}}
{{- $asked := false -}}
{{- range $driver.tokenRequests }}{{ if eq .audience $audience }}{{ $asked = true }}{{ end }}{{ end -}}
{{- if not $asked -}}
{{- fail (printf "the audience %q is not in secrets-store-csi-driver.tokenRequests and provider.oci.auth.types.workload.tokenRequest is false: no workload identity mount would have a token; add - audience: %q to tokenRequests, or set tokenRequest: true" $audience $audience) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Whether the provider may mint service-account tokens (RBAC and config agree). */}}
{{- define "oci-provider.tokenRequest" -}}
{{- $workload := .Values.provider.oci.auth.types.workload -}}
{{- if and $workload.enabled $workload.tokenRequest -}}true{{- end -}}
{{- end -}}

{{/* resources.limits.memory in MiB (Ki, Mi, Gi, M, G or bytes); 0 when unset. */}}
{{- define "oci-provider.limitMiB" -}}
{{- $limit := "" -}}
{{- with .Values.provider.resources.limits }}{{ $limit = toString (.memory | default "") }}{{ end -}}
{{- if not $limit -}}0
{{- else if hasSuffix "Gi" $limit -}}{{ mul (trimSuffix "Gi" $limit | int64) 1024 }}
{{- else if hasSuffix "Mi" $limit -}}{{ trimSuffix "Mi" $limit | int64 }}
{{- else if hasSuffix "Ki" $limit -}}{{ div (trimSuffix "Ki" $limit | int64) 1024 }}
{{- else if hasSuffix "G" $limit -}}{{ div (mul (trimSuffix "G" $limit | int64) 1000000000) 1048576 }}
{{- else if hasSuffix "M" $limit -}}{{ div (mul (trimSuffix "M" $limit | int64) 1000000) 1048576 }}
{{- else -}}{{ div ($limit | int64) 1048576 }}
{{- end -}}
{{- end -}}

{{/*
The in-flight byte budget in MiB: provider.memory.maxInFlightMiB, lowered so that the
memory model (baseline + 2 x in flight + cache <= 90% of the limit) holds under the
container's memory limit — a Go chart values file with its 100Mi limit gets a budget that
fits instead of an OOM kill. Fails when not even 1 MiB fits.
*/}}
{{- define "oci-provider.inFlightMiB" -}}
{{- $memory := .Values.provider.memory -}}
{{- $want := $memory.maxInFlightMiB | int64 -}}
{{- $limit := include "oci-provider.limitMiB" . | int64 -}}
{{- if eq $limit 0 -}}{{ $want }}
{{- else -}}
{{- $room := div (sub (div (mul $limit 9) 10) (add $memory.baselineMiB $memory.bundleCacheMiB)) 2 -}}
{{- if lt $room 1 -}}
{{- fail (printf "provider.resources.limits.memory %s cannot hold provider.memory.baselineMiB %v + bundleCacheMiB %v + an in-flight budget within 90%%: raise the limit or lower the cache" (toString .Values.provider.resources.limits.memory) $memory.baselineMiB $memory.bundleCacheMiB) -}}
{{- end -}}
{{- min $want $room -}}
{{- end -}}
{{- end -}}

{{/* The authTypes a SecretProviderClass may use, from the three `enabled` values, as the
provider's `[auth] allowed_types` reads it from the environment: "[workload, user]". */}}
{{- define "oci-provider.allowedTypes" -}}
{{- $types := .Values.provider.oci.auth.types -}}
{{- $allowed := list -}}
{{- range $name := list "user" "instance" "workload" -}}
{{- if (index $types $name).enabled -}}{{- $allowed = append $allowed $name -}}{{- end -}}
{{- end -}}
{{- if not $allowed -}}
{{- fail "provider.oci.auth.types: every auth type is disabled; enable at least one of instance, user, workload" -}}
{{- end -}}
[{{ join ", " $allowed }}]
{{- end -}}

{{/*
Workload identity federation's settings, checked: "" when it is off, else "on". Fails
naming the value to set when the provider could not start with them.
*/}}
{{- define "oci-provider.federation" -}}
{{- $workload := .Values.provider.oci.auth.types.workload -}}
{{- $f := $workload.federation -}}
{{- if and $workload.enabled $f.enabled -}}
{{- $at := "provider.oci.auth.types.workload.federation" -}}
{{- if not $f.domainUrl -}}
{{- fail (printf "%s.enabled needs domainUrl: the identity domain's URL (https://idcs-<id>.identity.oraclecloud.com)" $at) -}}
{{- end -}}
{{- if not $f.audience -}}
{{- fail (printf "%s.enabled needs audience: the service-account token audience the identity propagation trust pins (clientClaimValues)" $at) -}}
{{- end -}}
{{- if and $f.useInstancePrincipal (or $f.clientId $f.clientSecret.name) -}}
{{- fail (printf "%s.useInstancePrincipal signs the exchanges with the node's instance principal: leave clientId and clientSecret.name empty" $at) -}}
{{- end -}}
{{- if and (not $f.useInstancePrincipal) (not (and $f.clientId $f.clientSecret.name)) -}}
{{- fail (printf "%s needs clientId and clientSecret.name (a Secret in namespace %s), or useInstancePrincipal: true" $at .Release.Namespace) -}}
{{- end -}}
{{- $rpst := eq $f.requestedTokenType "urn:oci:token-type:oci-rpst" -}}
{{- if and $rpst (not $f.resourceType) -}}
{{- fail (printf "%s.requestedTokenType oci-rpst needs resourceType: the trust's impersonatingResource" $at) -}}
{{- end -}}
{{- if and (not $rpst) $f.resourceType -}}
{{- fail (printf "%s.resourceType is for oci-rpst only" $at) -}}
{{- end -}}
on
{{- end -}}
{{- end -}}
