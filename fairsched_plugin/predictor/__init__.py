"""The batch-latency predictor of the chunked-prefill paper (section 3.2.1): features, memory state,
profiling, training, ONNX export, ONNX Runtime serving and evaluation.

The scheduler imports ``features``, ``memory``, ``profiling`` and ``runtime`` (numpy and
onnxruntime only); ``train`` and ``export`` import torch and onnx, and only when training.
The modules are imported by name; this package imports nothing on its own.
"""
