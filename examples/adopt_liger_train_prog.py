"""A training step through liger-kernel's autograd Functions (RMSNorm, SwiGLU, RoPE), as a user's
training program calls them: inputs that require grad, forward, then ``backward()``. No tritonwarm
code in it. Recorded as a dry run, it records the launches the GPU run makes, backward included:

    tritonwarm record -o train.plan.yaml --target sm90 -- \
        python -m tritonwarm.examples.adopt_liger_train_prog --device meta
"""

from __future__ import annotations

import argparse

import torch

ROWS = (1, 37, 4096)
HIDDEN = (2048, 4096)
ROPE = ((1, 32, 8, 37, 128), (4, 32, 8, 512, 128))  # batch, q heads, kv heads, sequence, head dim


def run(device: str, ops=None) -> None:
    """``ops``: the package ``liger_kernel.ops`` (imported here when not given)."""
    if ops is None:
        import liger_kernel.ops as ops
    for dtype in (torch.bfloat16, torch.float32):
        for hidden in HIDDEN:
            weight = torch.ones(hidden, dtype=dtype, device=device, requires_grad=True)
            for rows in ROWS:
                x = torch.randn(rows, hidden, dtype=dtype, device=device, requires_grad=True)
                y = ops.rms_norm.LigerRMSNormFunction.apply(x, weight, 1e-6)
                gate, up = (torch.randn(rows, hidden, dtype=dtype, device=device, requires_grad=True) for _ in "gu")
                out = ops.swiglu.LigerSiLUMulFunction.apply(gate, up)
                (y.float().pow(2).mean() + out.float().mean()).backward()
        for batch, heads, kv_heads, seq, head_dim in ROPE:
            q = torch.randn(batch, heads, seq, head_dim, dtype=dtype, device=device, requires_grad=True)
            k = torch.randn(batch, kv_heads, seq, head_dim, dtype=dtype, device=device, requires_grad=True)
            cos, sin = (torch.randn(1, seq, head_dim, dtype=dtype, device=device) for _ in "cs")
            q2, k2 = ops.rope.LigerRopeFunction.apply(q, k, cos, sin)
            (q2.float().sum() + k2.float().sum()).backward()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    run(p.parse_args().device)
