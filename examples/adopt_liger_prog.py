"""A small training step through liger-kernel's Triton ops (RMSNorm, SwiGLU), forward and backward,
as a user's program calls them: no tritonwarm code in it. ``bench/adopt_libraries.py`` records it
with ``tritonwarm record`` and judges every warm-up by its launches on real tensors.

    python -m tritonwarm.examples.adopt_liger_prog --device cuda
"""

from __future__ import annotations

import argparse

import torch

ROWS = (1, 37, 4096)
HIDDEN = (2048, 4096)


def run(device: str) -> None:
    from liger_kernel.ops.rms_norm import rms_norm_backward, rms_norm_forward
    from liger_kernel.ops.swiglu import swiglu_backward, swiglu_forward

    for hidden in HIDDEN:
        weight = torch.ones(hidden, dtype=torch.bfloat16, device=device)
        for rows in ROWS:
            x = torch.randn(rows, hidden, dtype=torch.bfloat16, device=device)
            y, x2, rstd, block, warps, mode = rms_norm_forward(x, weight, 1e-6, 0.0, "llama", False)
            rms_norm_backward(torch.ones_like(y), x2, weight, rstd, 0.0, mode, block, warps, False, False)
            a, b, c = swiglu_forward(x, x.clone())
            swiglu_backward(a, b, torch.ones_like(c))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    run(p.parse_args().device)
