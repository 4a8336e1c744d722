"""Shared by the tests of gateway_http_metrics (moved out of tests/test_gateway_http_metrics.py)."""

from __future__ import annotations

SAMPLE = """\
# HELP smg_mm_tensors_total Multimodal tensors sent
# TYPE smg_mm_tensors_total counter
smg_mm_tensors_total{runtime="vllm",path="shm"} 1
smg_mm_tensors_total{runtime="vllm",path="inline"} 2
# TYPE smg_mm_tensor_bytes_total counter
smg_mm_tensor_bytes_total{runtime="vllm",path="shm"} 4816896
smg_mm_tensor_bytes_total{runtime="vllm",path="inline"} 32
# TYPE smg_mm_processing_total counter
smg_mm_processing_total{model="m",mode="router",reason="model_not_opted_in"} 1
"""
