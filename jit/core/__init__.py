"""The contract: targets, specialization classes, ``JitKernel`` and its fake launches, tracing with
Triton's own keys, fast dispatch."""
