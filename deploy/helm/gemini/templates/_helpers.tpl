{{/*
Names. The release's objects are <fullname>-<component>; fullname is the release name, with the
chart's name appended unless the release name already holds it.
*/}}
{{- define "gemini.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gemini.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "booster") */}}
{{- define "gemini.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gemini.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gemini.labels" -}}
{{ include "gemini.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: gemini
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
An image reference: (dict "root" $ "image" .Values.x.image). The tag defaults to appVersion; a
digest pins the image.
*/}}
{{- define "gemini.image" -}}
{{- $repo := .image.repository -}}
{{- if .root.Values.imageRegistry -}}
{{- $repo = printf "%s/%s" (trimSuffix "/" .root.Values.imageRegistry) $repo -}}
{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repo .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "gemini.boosterName" -}}{{ include "gemini.fullname" . }}-booster{{- end -}}
{{- define "gemini.agentServiceName" -}}{{ include "gemini.fullname" . }}-booster-agents{{- end -}}

{{/* The Secret holding the database URL (external mode). */}}
{{- define "gemini.databaseSecret" -}}
{{- if .Values.database.external.existingSecret -}}
{{- .Values.database.external.existingSecret -}}
{{- else -}}
{{- include "gemini.fullname" . }}-database
{{- end -}}
{{- end -}}

{{/*
The Secret the migration Job reads the URL from: the user's own, or the chart's hook copy (the
chart's ordinary Secret does not exist yet when a pre-install hook runs).
*/}}
{{- define "gemini.migrationDatabaseSecret" -}}
{{- if .Values.database.external.existingSecret -}}
{{- .Values.database.external.existingSecret -}}
{{- else -}}
{{- include "gemini.fullname" . }}-database-migrate
{{- end -}}
{{- end -}}

{{/*
The hook events of the migration and of what it needs (its URL Secret, its NetworkPolicy), so
that they are created in one phase, in hook-weight order: before install and every upgrade
against an external database; after install, then before every upgrade, for the chart's own
CloudNativePG cluster (which does not exist before install).
*/}}
{{- define "gemini.migrationHookEvents" -}}
{{- ternary "post-install,pre-upgrade" "pre-install,pre-upgrade" (eq .Values.database.mode "cnpg") -}}
{{- end -}}

{{- define "gemini.cnpgName" -}}{{ include "gemini.fullname" . }}-pg{{- end -}}

{{- define "gemini.credentialsSecret" -}}
{{- if .Values.credentials.existingSecret -}}
{{- .Values.credentials.existingSecret -}}
{{- else -}}
{{- include "gemini.fullname" . }}-credentials
{{- end -}}
{{- end -}}

{{- define "gemini.tlsSecret" -}}
{{- if .Values.tls.existingSecret -}}
{{- .Values.tls.existingSecret -}}
{{- else -}}
{{- include "gemini.fullname" . }}-booster-tls
{{- end -}}
{{- end -}}

{{/*
How Booster and the migration Job reach PostgreSQL: (dict "root" $ "secret" <URL Secret>).
External: the URL from its Secret.
CloudNativePG: libpq's own PG* variables from the operator's app Secret, and a URL naming only
the driver, so no password is ever spliced into a URL (nothing to escape).
*/}}
{{- define "gemini.databaseEnv" -}}
{{- $secret := .secret -}}
{{- with .root -}}
{{- if eq .Values.database.mode "cnpg" }}
{{- $secret := printf "%s-app" (include "gemini.cnpgName" .) }}
- name: GEMINI_BOOSTER_DATABASE_URL
  value: "postgresql+psycopg://"
- {name: PGHOST, valueFrom: {secretKeyRef: {name: {{ $secret }}, key: host}}}
- {name: PGPORT, valueFrom: {secretKeyRef: {name: {{ $secret }}, key: port}}}
- {name: PGDATABASE, valueFrom: {secretKeyRef: {name: {{ $secret }}, key: dbname}}}
- {name: PGUSER, valueFrom: {secretKeyRef: {name: {{ $secret }}, key: username}}}
- {name: PGPASSWORD, valueFrom: {secretKeyRef: {name: {{ $secret }}, key: password}}}
- {name: PGSSLMODE, value: require}
{{- else }}
- name: GEMINI_BOOSTER_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ .Values.database.external.secretKey }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The restricted Pod Security level for Booster's containers: no root, no privilege escalation,
no capabilities, the runtime's seccomp profile, and an immutable root file system.
*/}}
{{- define "gemini.restrictedContainerSecurity" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{- define "gemini.restrictedPodSecurity" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{/* Environment every Booster process needs besides the database. */}}
{{- define "gemini.boosterEnv" -}}
- {name: GEMINI_BOOSTER_LOG_LEVEL, value: {{ .Values.booster.logLevel | quote }}}
- {name: TMPDIR, value: /tmp}
- {name: HOME, value: /tmp}
- {name: PYTHONDONTWRITEBYTECODE, value: "1"}
{{- end -}}

{{/* Egress of Booster and the migration Job: DNS, and PostgreSQL where it is. */}}
{{- define "gemini.egressRules" -}}
- to:
    - namespaceSelector: {}
      podSelector:
        matchLabels: {k8s-app: kube-dns}
  ports: [{port: 53, protocol: UDP}, {port: 53, protocol: TCP}]
{{- if eq .Values.database.mode "cnpg" }}
- to:
    - podSelector:
        matchLabels: {cnpg.io/cluster: {{ include "gemini.cnpgName" . }}}
  ports: [{port: 5432, protocol: TCP}]
{{- else }}
- ports: [{port: {{ .Values.database.external.port }}, protocol: TCP}]
  {{- with .Values.database.external.cidrs }}
  to:
    {{- range . }}
    - ipBlock: {cidr: {{ . }}}
    {{- end }}
  {{- end }}
{{- end }}
{{- end -}}
