{{/* Names, labels and small computed values shared by the templates. */}}

{{- define "sw.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* "<release>-sandbox-workspace", or the release name when it already says it. */}}
{{- define "sw.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sw.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "sw.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "sw.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sw.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The namespace of sessions, sandbox pods and their Secrets. */}}
{{- define "sw.sessionsNamespace" -}}
{{- default (printf "%s-sessions" .Release.Namespace) .Values.sessions.namespace -}}
{{- end -}}

{{- define "sw.apiName" -}}{{ include "sw.fullname" . }}-api{{- end -}}
{{- define "sw.operatorName" -}}{{ include "sw.fullname" . }}-operator{{- end -}}

{{- define "sw.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "sw.sandboxImage" -}}
{{- $repo := default .Values.image.repository .Values.sandbox.image.repository -}}
{{- $tag := default (default .Chart.AppVersion .Values.image.tag) .Values.sandbox.image.tag -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}

{{/* The Secret holding the service token: the user's, or the chart's. */}}
{{- define "sw.serviceTokenSecret" -}}
{{- default (include "sw.apiName" .) .Values.auth.serviceToken.existingSecret -}}
{{- end -}}

{{/* Does the chart's own Secret "<fullname>-api" have anything to hold? */}}
{{- define "sw.chartSecretNeeded" -}}
{{- if or (and .Values.auth.serviceToken.enabled (not .Values.auth.serviceToken.existingSecret)) (and .Values.chat.apiKey.value (not .Values.chat.apiKey.existingSecret)) (not .Values.auth.streamToken.existingSecret) -}}true{{- end -}}
{{- end -}}

{{/* The Secret holding the stream-token key: the user's, else the chart's own. */}}
{{- define "sw.streamTokenSecret" -}}
{{- default (include "sw.apiName" .) .Values.auth.streamToken.existingSecret -}}
{{- end -}}

{{/*
The object store's settings, for the API (prefix SANDBOX_WORKSPACE_) and the operator
(SANDBOX_OPERATOR_): the same bucket, credentials from store.s3.existingSecret or the
pods' AWS credential chain. Call with (dict "prefix" "…" "store" .Values.store).
*/}}
{{- define "sw.storeEnv" -}}
{{- $p := .prefix }}
{{- $s := .store }}
- name: {{ $p }}STORE
  value: {{ $s.mode | quote }}
{{- if eq $s.mode "s3" }}
{{- if not $s.s3.bucket }}
{{- fail "store.mode=s3 needs store.s3.bucket (an existing bucket)" }}
{{- end }}
- name: {{ $p }}S3__BUCKET
  value: {{ $s.s3.bucket | quote }}
- name: {{ $p }}S3__PREFIX
  value: {{ $s.s3.prefix | quote }}
- name: {{ $p }}S3__REGION
  value: {{ $s.s3.region | quote }}
- name: {{ $p }}S3__VIRTUAL_HOSTED_STYLE
  value: {{ $s.s3.virtualHostedStyle | quote }}
- name: {{ $p }}S3__VERSIONED_BUCKET
  value: {{ $s.s3.versionedBucket | default "refuse" | quote }}
{{- if not (kindIs "invalid" $s.s3.signPayload) }}
- name: {{ $p }}S3__SIGN_PAYLOAD
  value: {{ $s.s3.signPayload | quote }}
{{- end }}
{{- with $s.s3.endpointUrl }}
- name: {{ $p }}S3__ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
{{- with $s.s3.existingSecret }}
- name: {{ $p }}S3__ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $s.s3.accessKeyIdKey }}
- name: {{ $p }}S3__SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $s.s3.secretAccessKeyKey }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The sandbox's confinement mode, checked at install: a runtimeClassName of gVisor (runsc
has no Landlock) with "require" would answer 503 to every execution, so it is refused
here and the install must choose "auto" explicitly (docs/security.md).
*/}}
{{- define "sw.confinement" -}}
{{- $rc := lower (default "" .runtimeClassName) }}
{{- if and (eq .confinement "require") (or (contains "gvisor" $rc) (contains "runsc" $rc)) }}
{{- fail (printf "sandbox.runtimeClassName=%s is gVisor, which has no Landlock: with sandbox.confinement=require every execution would be refused (503). Set sandbox.confinement=auto to run code there without Landlock (gVisor's own kernel still isolates the pod; conversations of one session are then not isolated from each other: docs/security.md, \"Confinement under gVisor\")" .runtimeClassName) }}
{{- end }}
{{- .confinement }}
{{- end -}}

{{/* An IPv4 address as an integer. */}}
{{- define "sw.ipv4int" -}}
{{- $p := splitList "." . -}}
{{- add (mul (atoi (index $p 0)) 16777216) (mul (atoi (index $p 1)) 65536) (mul (atoi (index $p 2)) 256) (atoi (index $p 3)) -}}
{{- end -}}

{{/* "true" when CIDR .a lies inside CIDR .b (IPv4 exactly; IPv6 only inside ::/0 or equal). */}}
{{- define "sw.cidrWithin" -}}
{{- $a := splitList "/" .a -}}
{{- $b := splitList "/" .b -}}
{{- $v6a := contains ":" .a -}}
{{- $v6b := contains ":" .b -}}
{{- if and $v6a $v6b -}}
{{- if or (eq .b "::/0") (eq .a .b) }}true{{ end -}}
{{- else if and (not $v6a) (not $v6b) -}}
{{- $bits := atoi (index $b 1) -}}
{{- if ge (atoi (index $a 1)) $bits -}}
{{- $scale := 1 -}}
{{- range until (sub 32 $bits | int) }}{{ $scale = mul $scale 2 }}{{ end -}}
{{- if eq (div (include "sw.ipv4int" (index $a 0) | int64) $scale) (div (include "sw.ipv4int" (index $b 0) | int64) $scale) }}true{{ end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Ranges sandboxes never reach: link-local (cloud metadata) and the deployment's own. */}}
{{- define "sw.internalCIDRs" -}}
{{- concat (list "169.254.0.0/16" "fe80::/10") .Values.sandbox.networkPolicy.internalCIDRs | toJson -}}
{{- end -}}

{{- define "sw.egressProxyName" -}}{{ include "sw.fullname" . }}-egress-proxy{{- end -}}
{{/* The egress CA: a Secret in the release namespace (key and certificate, the proxy's
alone) and a ConfigMap in the sessions namespace (certificate and trust bundle). */}}
{{- define "sw.egressCaSecret" -}}
{{- default (printf "%s-egress-ca" (include "sw.fullname" .)) .Values.egressProxy.ca.existingSecret -}}
{{- end -}}
{{- define "sw.egressCaConfigMap" -}}{{ include "sw.fullname" . }}-egress-ca{{- end -}}
