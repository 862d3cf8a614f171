"""Export PyTorch networks to verified ONNX models in a Triton model repository."""
