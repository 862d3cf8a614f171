"""The InferenceService operator: a typed spec, pure builders, and thin kopf handlers."""
