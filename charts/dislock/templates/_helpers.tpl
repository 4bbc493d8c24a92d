{{/*
Prefix of every object name: the release name when it already says "dislock", else
"<release>-dislock". Truncated so that "<fullname>-webhook-cert" stays a valid name.
*/}}
{{- define "dislock.fullname" -}}
{{- $name := .Values.fullnameOverride -}}
{{- if not $name -}}
{{- $name = ternary .Release.Name (printf "%s-dislock" .Release.Name) (contains "dislock" .Release.Name) -}}
{{- end -}}
{{- $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{/* Name of the webhook's Deployment, Service, ServiceAccount, RBAC objects and configurations. */}}
{{- define "dislock.webhookName" -}}
{{- printf "%s-webhook" (include "dislock.fullname" .) -}}
{{- end -}}

{{- define "dislock.serviceAccountName" -}}
{{- default (include "dislock.webhookName" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* The Secret holding the serving certificate: written by the webhook itself or by cert-manager. */}}
{{- define "dislock.certSecretName" -}}
{{- printf "%s-webhook-cert" (include "dislock.fullname" .) -}}
{{- end -}}

{{/*
The Certificate whose CA cert-manager's CA injector copies into the webhook configurations: the
chart's own CA, or, with an issuer of yours, the serving Certificate (its Secret's ca.crt is your
issuer's CA).
*/}}
{{- define "dislock.caCertificateName" -}}
{{- if .Values.certManager.issuerRef.name -}}
{{- include "dislock.webhookName" . -}}
{{- else -}}
{{- printf "%s-ca" (include "dislock.webhookName" .) -}}
{{- end -}}
{{- end -}}

{{/* The database Secret in the release namespace, and the name of its copies. */}}
{{- define "dislock.dbSecretName" -}}
{{- default (printf "%s-db" (include "dislock.fullname" .)) .Values.database.existingSecret -}}
{{- end -}}

{{/* controller-runtime's leader election Lease (LeaderElectionID in main.go). */}}
{{- define "dislock.leaseName" -}}
dislock-webhook
{{- end -}}

{{/* The fencing token record's ConfigMap (tokenrecord.Name). */}}
{{- define "dislock.tokenRecordName" -}}
dislock-token-record
{{- end -}}

{{/* Where the serving certificate is mounted; the webhook reads tls.crt and tls.key there. */}}
{{- define "dislock.certDir" -}}
/tmp/k8s-webhook-server/serving-certs
{{- end -}}

{{- define "dislock.selectorLabels" -}}
app.kubernetes.io/name: dislock
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "dislock.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "dislock.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* image renders repository:tag or repository@digest from an image dict and defaults. */}}
{{- define "dislock.imageRef" -}}
{{- $repo := .repository -}}
{{- if .digest -}}
{{- printf "%s@%s" $repo .digest -}}
{{- else -}}
{{- printf "%s:%s" $repo .tag -}}
{{- end -}}
{{- end -}}

{{- define "dislock.image" -}}
{{- include "dislock.imageRef" (dict "repository" .Values.image.repository "tag" (default .Chart.AppVersion .Values.image.tag) "digest" .Values.image.digest) -}}
{{- end -}}

{{/*
The sidecar's image: the agent-only image, never the webhook's (which holds the operator CLI). Its
tag follows the webhook's unless agent.image.tag is set.
*/}}
{{- define "dislock.agentImage" -}}
{{- $a := .Values.agent.image -}}
{{- include "dislock.imageRef" (dict "repository" $a.repository "tag" (default (default .Chart.AppVersion .Values.image.tag) $a.tag) "digest" $a.digest) -}}
{{- end -}}

{{/*
Namespaces neither webhook ever intercepts, whatever their labels: the release namespace (nothing
that keeps dislock running may depend on dislock's webhook answering) and kube-system (the cluster's
own CronJobs must never wait for it), plus webhook.excludeNamespaces.
*/}}
{{- define "dislock.namespaceSelector" -}}
matchLabels:
  dislock.io/injection: enabled
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values:
      {{- range uniq (concat (list .Release.Namespace "kube-system") .Values.webhook.excludeNamespaces) }}
      - {{ . | quote }}
      {{- end }}
{{- end -}}

{{/*
Checks of values that the schema cannot express; each failure says what to set.
*/}}
{{- define "dislock.validate" -}}
{{- if not .Values.clusterName -}}
{{- fail "clusterName is required: set it to this data centre's name, different in every cluster (e.g. --set clusterName=dc-a)" -}}
{{- else if not (regexMatch "^[[:graph:]]{1,63}$" .Values.clusterName) | or (contains "/" .Values.clusterName) -}}
{{- fail (printf "clusterName %q is not usable in a lock owner: want at most 63 printable characters without '/' or spaces (e.g. dc-a)" .Values.clusterName) -}}
{{- end -}}
{{- if and .Values.database.url .Values.database.existingSecret -}}
{{- fail "database.url and database.existingSecret are both set: set one (existingSecret is preferred: the URL holds a password)" -}}
{{- end -}}
{{- if not (or .Values.database.url .Values.database.existingSecret) -}}
{{- fail "the database is not set: set database.existingSecret to a Secret in the release namespace holding the PostgreSQL URL under database.secretKey, or database.url" -}}
{{- end -}}
{{- with .Values.database.tls -}}
{{- if and .caSecret.name .caConfigMap.name -}}
{{- fail (printf "database.tls.caSecret.name (%q) and database.tls.caConfigMap.name (%q) are both set: set one, the CA bundle comes from one place" .caSecret.name .caConfigMap.name) -}}
{{- end -}}
{{- end -}}
{{- range $value, $flag := dict "podLabels" "--pod-labels" "podAnnotations" "--pod-annotations" -}}
{{- range $k, $v := index $.Values.agent $value -}}
{{- if contains "," $v -}}
{{- fail (printf "agent.%s.%s: %q holds a comma, which the webhook's %s splits entries on: drop the comma" $value $k $v $flag) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Where the database CA bundle is mounted in the webhook's pod and the test pod; the webhook's
--database-ca-file names the file ca.crt in it.
*/}}
{{- define "dislock.databaseCADir" -}}
/etc/dislock/database-ca
{{- end -}}

{{/* The volume holding the database CA (database.tls), with its key projected as ca.crt. */}}
{{- define "dislock.databaseCAVolume" -}}
{{- with .Values.database.tls -}}
- name: database-ca
{{- if .caSecret.name }}
  secret:
    secretName: {{ .caSecret.name }}
    items:
      - key: {{ .caSecret.key }}
        path: ca.crt
{{- else }}
  configMap:
    name: {{ .caConfigMap.name }}
    items:
      - key: {{ .caConfigMap.key }}
        path: ca.crt
{{- end }}
{{- end -}}
{{- end -}}

{{- define "dislock.databaseCAMount" -}}
- name: database-ca
  mountPath: {{ include "dislock.databaseCADir" . }}
  readOnly: true
{{- end -}}

{{- define "dislock.databaseCA" -}}
{{- with .Values.database.tls -}}
{{- if or .caSecret.name .caConfigMap.name }}true{{ end -}}
{{- end -}}
{{- end -}}

{{/*
A map as the k=v,k2=v2 list the webhook's --pod-labels and --pod-annotations take (Go templates
range over a map's keys in sorted order, so the flag does not change between renderings).
*/}}
{{- define "dislock.keyValues" -}}
{{- $out := list -}}
{{- range $k, $v := . -}}
{{- $out = append $out (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}
