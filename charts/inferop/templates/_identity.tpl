{{/* Generated from inferop_operator/identity.py by `make crd`; `make check` fails if it drifts. */}}

{{/* The API group of InferenceServices. */}}
{{- define "inferop.apiGroup" -}}inferop.dev{{- end }}

{{/* A selector of every Triton pod, stable or a rollout's candidate. */}}
{{- define "inferop.tritonPodsSelector" -}}
matchLabels:
  app.kubernetes.io/managed-by: inferop
matchExpressions:
  - key: app.kubernetes.io/component
    operator: In
    values: [canary, predictor]
{{- end }}
