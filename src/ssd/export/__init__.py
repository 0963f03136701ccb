"""Export: ONNX and TorchScript artifacts and the parity check against PyTorch."""
