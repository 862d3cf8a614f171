{{/* Generated from inferop_operator/identity.py by `make crd`; `make check` fails if it drifts. */}}

{{/* The API group of InferenceServices. */}}
{{- define "inferop.apiGroup" -}}inferop.dev{{- end }}

{{/* Labels selecting the Triton pods of every InferenceService. */}}
{{- define "inferop.predictorSelector" -}}
app.kubernetes.io/component: predictor
app.kubernetes.io/managed-by: inferop
{{- end }}
