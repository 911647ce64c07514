{{/*
Names. The fullname names the Deployment, service account, Service and RBAC objects:
RELEASE-controller, so the release statefulset-drain gets the overlays' names.
*/}}
{{- define "statefulset-drain.fullname" -}}
{{- default (printf "%s-controller" .Release.Name) .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "statefulset-drain.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "statefulset-drain.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: the existing service account, with serviceAccount.create false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
The watched namespaces, comma-separated as --namespace takes them, or "" for every namespace.
*/}}
{{- define "statefulset-drain.watchNamespaces" -}}
{{- join "," .Values.watchNamespaces -}}
{{- end -}}

{{/*
The labels that select the controller's pods: the overlays' (the Deployment's selector is
immutable, and tests/run and the plugin find the controller by it).
*/}}
{{- define "statefulset-drain.selectorLabels" -}}
app.kubernetes.io/name: statefulset-drain-controller
{{- end -}}

{{/*
Helm's own labels, on every object (artifacts/chart/check ignores exactly these).
*/}}
{{- define "statefulset-drain.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/*
The labels of the objects that carry the overlays' app label (Deployment, Service, pods).
*/}}
{{- define "statefulset-drain.labels" -}}
{{ include "statefulset-drain.selectorLabels" . }}
{{ include "statefulset-drain.helmLabels" . }}
{{- end -}}

{{/*
The controller's rules, the same for the ClusterRole (every namespace) and the Role (in each
watched namespace).
Kept in step with artifacts/overlays/cluster-wide/rbac.yaml by artifacts/chart/check.
*/}}
{{- define "statefulset-drain.rules" -}}
# Watch the sets (built-in, and OpenKruise's Advanced StatefulSets when that API is installed);
# patch only to write the drain-status annotation.
- apiGroups: ["apps", "apps.kruise.io"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "patch"]
# Read the set's update revision: the controller of its drain pods (so that `kubectl drain`
# evicts them, and they go with the set).
- apiGroups: ["apps"]
  resources: ["controllerrevisions"]
  verbs: ["get"]
# Watch stateful pods (metadata only) and drain pods; create and delete drain pods.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete"]
# Watch claims (metadata only); keep the drain record on them; delete them after a drain
# succeeded (with a UID precondition).
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "patch", "delete"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}

{{/*
Whether the replicas elect a leader; more than one replica without it would act twice.
*/}}
{{- define "statefulset-drain.leaderElect" -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) -}}
{{- fail "replicas > 1 needs leaderElection.enabled: true (otherwise every replica acts)" -}}
{{- end -}}
{{- if .Values.leaderElection.enabled }}true{{ end -}}
{{- end -}}
