"""Kernels you did not write: ``@triton.autotune`` / ``@triton.heuristics`` stacks (``autotune``) and their
stored winners (``winners``), ``JITFunction``s reached without a ``JitKernel`` (``foreign``), and
recording a whole program's launches as a replayable plan (``record``)."""
