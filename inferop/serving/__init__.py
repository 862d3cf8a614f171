"""Local serving: NVIDIA's tritonserver on a model repository, with our ONNX Runtime model for its
python backend standing in for the ONNX Runtime backend that ships only in NVIDIA's container images."""
