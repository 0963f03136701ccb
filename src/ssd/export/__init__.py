"""Export: ONNX (FP32, INT8), OpenVINO and torch.export artifacts (``formats.export``), the parity check against
PyTorch, and ``ssd benchmark`` over every format."""
