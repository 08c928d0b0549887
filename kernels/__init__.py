"""Triton device code (``@triton.jit``), each with a plain PyTorch reference."""
