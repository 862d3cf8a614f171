{{/* Chart name, overridable. */}}
{{- define "inferop.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's objects: the release name when it already contains the chart name, else
"<release>-<chart>"; at most 63 characters (a DNS label).
*/}}
{{- define "inferop.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Chart name and version, for the helm.sh/chart label. */}}
{{- define "inferop.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the operator's Pod; they never change between upgrades. */}}
{{- define "inferop.selectorLabels" -}}
app.kubernetes.io/name: {{ include "inferop.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Standard labels of every object of the release. */}}
{{- define "inferop.labels" -}}
helm.sh/chart: {{ include "inferop.chart" . }}
{{ include "inferop.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: inferop
{{- end }}

{{/* The ServiceAccount the operator runs as. */}}
{{- define "inferop.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "inferop.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator's image: repository@digest when a digest is given, else repository:tag (appVersion). */}}
{{- define "inferop.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* True (non-empty) when the Prometheus Operator's objects are wanted and the cluster serves them. */}}
{{- define "inferop.monitoring" -}}
{{- if and .Values.monitoring.enabled (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") }}true{{ end }}
{{- end }}

{{/*
RBAC, split like kopf's own example (docs/deployment-rbac.yaml): what the framework needs to watch and
report, and what the application's handlers do. Every verb below was checked against a real API server
with the chart's ServiceAccount (tests/kube/test_rbac.py); nothing else is granted: no wildcards, no
Secrets (Triton's admin token is drawn inside each pod and never stored), Pods only read, no deletes but of
the optional children (HorizontalPodAutoscaler, PodDisruptionBudget, NetworkPolicy).
The application's rules grant each child in the operator's registry (CHILDREN in
operator/inferop_operator/builders.py) exactly the verbs its reconcile loop uses (tests/kube/test_chart.py).
*/}}
{{- define "inferop.frameworkRules" -}}
# kopf lists and watches InferenceServices (the handlers and the in-memory index that the Deployment
# handler reads its owner from, so no GET is needed), and patches them to keep its handler progress and
# the last handled spec in annotations of the API group.
- apiGroups: [{{ include "inferop.apiGroup" . | quote }}]
  resources: ["inferenceservices"]
  verbs: ["list", "watch", "patch"]
# kopf watches Deployments for the handler that follows their readiness into the owner's status.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "watch"]
# kopf watches the Triton pods (label-selected in the handlers) to explain failures in the status
# (PodsHealthy: OOMKilled, CrashLoopBackOff, an image that cannot be pulled). Read only: everything comes from
# the watch, so not even get; pods are never changed or deleted, their logs and exec stay closed.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
# kopf posts core/v1 Events (Reconciled, refusals, warnings) that `kubectl describe` shows; it never
# updates or deletes them.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{- define "inferop.applicationRules" -}}
# Phase, conditions and thread plan go to the status subresource (merge patch).
- apiGroups: [{{ include "inferop.apiGroup" . | quote }}]
  resources: ["inferenceservices/status"]
  verbs: ["patch"]
# Children are written by server-side apply: a PATCH, which the API server also authorizes as a create
# when the object does not exist yet. Deleting a service is left to garbage collection (owner references);
# a rollout's candidate (<service>-canary: its ConfigMap, Service and Deployment) is deleted when it is
# promoted or rolled back.
- apiGroups: [""]
  resources: ["configmaps", "services"]
  verbs: ["create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["create", "patch", "delete"]
# The HorizontalPodAutoscaler (autoscaling/v2 or v2beta2) is also deleted when spec.autoscaling is unset.
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["create", "patch", "delete"]
# The PodDisruptionBudget (policy/v1 or v1beta1) is also deleted when at most one pod may run.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["create", "patch", "delete"]
# The NetworkPolicy (spec.networkPolicy) is also deleted when networkPolicy.enabled is unset.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create", "patch", "delete"]
# The HTTPRoute (Gateway API) attaching a service to its Gateway, whose weights a rollout moves; deleted when no
# gateway is named. The Gateway itself is only read, to say when the one named does not exist.
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["httproutes"]
  verbs: ["create", "patch", "delete"]
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["gateways"]
  verbs: ["get"]
# Where Envoy Gateway serves it, the BackendTrafficPolicy that refuses at the gateway what a pod would reject;
# deleted with the HTTPRoute.
- apiGroups: ["gateway.envoyproxy.io"]
  resources: ["backendtrafficpolicies"]
  verbs: ["create", "patch", "delete"]
{{- end }}

{{/*
kopf's observation of the cluster (rbac.clusterScanning), read-only: it watches CustomResourceDefinitions
to follow a CRD created or changed while it runs and, given --namespace, lists and watches Namespaces to
match it. In cluster-wide mode it never lists Namespaces. Without these kopf retries each forbidden
listing for about a minute (its API retry backoffs) at every start before falling back to a start-up scan
and the namespace as given.
*/}}
{{- define "inferop.scanningRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- end }}
