"""tritonwarm: Triton kernels for LLM serving, with an ahead-of-time warm-up of Triton's own cache."""

__version__ = "0.1.0"
