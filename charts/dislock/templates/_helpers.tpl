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

{{/* Where the serving certificate is mounted: cert-manager's is read there; a self-signed one is served from its Secret, and the rotator waits for its files there. */}}
{{- define "dislock.certDir" -}}
/tmp/k8s-webhook-server/serving-certs
{{- end -}}

{{- define "dislock.selectorLabels" -}}
app.kubernetes.io/name: dislock
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "dislock.gatewayName" -}}
{{- printf "%s-gateway" (include "dislock.fullname" .) -}}
{{- end -}}

{{/* gatewayHost is the name pods reach the lock gateway by: its Service's, which its certificate names. */}}
{{- define "dislock.gatewayHost" -}}
{{- printf "%s.%s.svc" (include "dislock.gatewayName" .) .Release.Namespace -}}
{{- end -}}

{{- define "dislock.gatewaySelectorLabels" -}}
app.kubernetes.io/name: dislock
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end -}}

{{- define "dislock.gatewayLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "dislock.gatewaySelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
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
{{- if and .Values.gateway.enabled (not .Values.database.copyToNamespaces) -}}
{{- fail "gateway.enabled needs database.copyToNamespaces: the webhook writes each namespace's gateway credential into its Secret" -}}
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
{{- include "dislock.validateBounds" . -}}
{{- range $value, $flag := dict "podLabels" "--pod-labels" "podAnnotations" "--pod-annotations" -}}
{{- range $k, $v := index $.Values.agent $value -}}
{{- $parts := splitList "/" $k -}}
{{- $name := last $parts -}}
{{- $prefix := join "/" (initial $parts) -}}
{{- if eq $value "podAnnotations" -}}{{- $prefix = lower $prefix -}}{{- end -}}
{{- if not (regexMatch "^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$" $name) | or (gt (len $parts) 2) | or (gt (len $prefix) 253) | or (and (eq (len $parts) 2) (not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" $prefix))) -}}
{{- fail (printf "agent.%s: %q is not a Kubernetes %s key: want [prefix/]name, the name at most 63 letters, digits, '-', '_' or '.' starting and ending with a letter or digit, the prefix a DNS subdomain (e.g. example.com/team)" $value $k (trimPrefix "pod" $value | lower | trimSuffix "s")) -}}
{{- else if hasPrefix "dislock.io/" $k -}}
{{- fail (printf "agent.%s: %q is in the dislock.io/ prefix, which is dislock's own: choose another key" $value $k) -}}
{{- end -}}
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

{{/*
The bounds `dislock webhook` checks at start (webhook/flags), so that a value it would refuse
fails the install instead of crash-looping the pods. The numbers repeat the binary's;
test/chart's TestEveryValueTheWebhookRefusesTheChartRefuses holds them to it.
*/}}
{{- define "dislock.validateBounds" -}}
{{- with .Values.database -}}
{{- if lt (include "dislock.seconds" .retention | float64) 172800.0 -}}
{{- fail (printf "database.retention %s is shorter than 48h: a pod that starts late could claim a deleted window and run it again (set at least 48h, e.g. 720h)" .retention) -}}
{{- end -}}
{{- $ledger := include "dislock.seconds" .ledgerInterval | float64 -}}
{{- if and (gt $ledger 0.0) (lt $ledger 5.0) -}}
{{- fail (printf "database.ledgerInterval %s is shorter than 5s (set at least 5s, e.g. 30s)" .ledgerInterval) -}}
{{- else if gt $ledger 300.0 -}}
{{- fail (printf "database.ledgerInterval %s is longer than 5m: the metrics would be that stale, and a stopped alerting cluster would keep the alerts three intervals (set at most 5m, e.g. 30s)" .ledgerInterval) -}}
{{- end -}}
{{- if ge (include "dislock.seconds" .retention | float64) 9223372036.0 -}}
{{- fail (printf "database.retention %s is beyond the longest duration the webhook reads (about 2562047h): set e.g. 87600h for ten years" .retention) -}}
{{- end -}}
{{- if gt (include "dislock.seconds" .tokenRecordInterval | float64) 60.0 -}}
{{- fail (printf "database.tokenRecordInterval %s is longer than 1m, the longest a restored database may hand out tokens before their epoch moves past the record (set at most 1m, e.g. 5s)" .tokenRecordInterval) -}}
{{- end -}}
{{- end -}}
{{- $timeout := .Values.webhook.registryTimeout -}}
{{- $budget := .Values.webhook.registry.reviewBudget -}}
{{- range $name, $v := dict "webhook.registryTimeout" $timeout "webhook.registry.reviewBudget" $budget -}}
{{- if eq (include "dislock.seconds" $v | float64) 0.0 -}}
{{- fail (printf "%s %s is zero: set the deadline itself, e.g. 3s" $name $v) -}}
{{- end -}}
{{- end -}}
{{- if gt (include "dislock.seconds" $timeout | float64) (include "dislock.seconds" $budget | float64) -}}
{{- fail (printf "webhook.registryTimeout %s is longer than webhook.registry.reviewBudget %s, the budget of all lookups of one admission that contains it: lower the timeout or raise the budget" $timeout $budget) -}}
{{- end -}}
{{- $agent := .Values.agent -}}
{{- $sizes := dict -}}
{{- range $resource, $d := dict "cpu" (list "cpuRequest" "cpuLimit" "maxCPU" "10m" "500m" "1") "memory" (list "memoryRequest" "memoryLimit" "maxMemory" "16Mi" "64Mi" "256Mi") -}}
{{- $request := index $agent (index $d 0) -}}
{{- $limit := index $agent (index $d 1) -}}
{{- $max := index $agent (index $d 2) -}}
{{- range $name := list (index $d 0) (index $d 1) (index $d 2) -}}
{{- $v := index $agent $name -}}
{{- if and $v (le (include "dislock.quantity" $v | float64) 0.0) -}}
{{- fail (printf "agent.%s %s is not a positive quantity" $name $v) -}}
{{- end -}}
{{- end -}}
{{- $least := index (dict "cpu" "10m" "memory" "32Mi") $resource -}}
{{- if and $limit (lt (include "dislock.quantity" $limit | float64) (include "dislock.quantity" $least | float64)) -}}
{{- fail (printf "agent.%s %s is below %s, the least the agent runs with" (index $d 1) $limit $least) -}}
{{- end -}}
{{- $lim := include "dislock.quantity" (default (index $d 4) $limit) | float64 -}}
{{- $req := include "dislock.quantity" (default (index $d 3) $request) | float64 -}}
{{- if and $request (gt $req $lim) -}}
{{- fail (printf "agent.%s %s is above the %s limit %s (raise agent.%s too, or lower this)" (index $d 0) $request $resource (default (index $d 4) $limit) (index $d 1)) -}}
{{- end -}}
{{- $most := include "dislock.quantity" (default (index $d 5) $max) | float64 -}}
{{- range $i, $size := list $req $lim -}}
{{- if gt $size $most -}}
{{- fail (printf "agent.%s %s is above agent.%s %s, the most a CronJob may ask for: raise agent.%s or lower this" (index $d $i) (default (index $d (add $i 3)) (index $agent (index $d $i))) (index $d 2) (default (index $d 5) $max) (index $d 2)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* dislock.seconds: a Go duration, as the values schema's patterns allow it, in seconds (a number for templates and for PromQL). */}}
{{- define "dislock.seconds" -}}
{{- $units := dict "ns" 1e-9 "us" 1e-6 "µs" 1e-6 "ms" 1e-3 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9.]+[^0-9.]+" (toString .) -1 -}}
{{- $n := regexFind "^[0-9.]+" . -}}
{{- $total = addf $total (mulf (float64 $n) (index $units (trimPrefix $n .))) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/* dislock.quantity: a Kubernetes quantity, as the values schema's pattern allows it, as a number. */}}
{{- define "dislock.quantity" -}}
{{- $units := dict "" 1.0 "m" 1e-3 "k" 1e3 "M" 1e6 "G" 1e9 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 -}}
{{- $n := regexFind "^[0-9.]+" (toString .) -}}
{{- mulf (float64 $n) (index $units (trimPrefix $n (toString .))) -}}
{{- end -}}
