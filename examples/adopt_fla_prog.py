"""A small step through flash-linear-attention's (``fla-core``) autotuned L2-norm kernels, forward and
backward, as a user's program calls them: no tritonwarm code in it. ``bench/adopt_libraries.py``
records it with ``tritonwarm record`` and judges every warm-up by its launches on real tensors.

    python -m tritonwarm.examples.adopt_fla_prog --device cuda
"""

from __future__ import annotations

import argparse

import torch

ROWS = (1, 37, 4096)
HIDDEN = (1024,)


def run(device: str) -> None:
    from fla.modules.norm.l2norm import l2norm_bwd, l2norm_fwd

    for hidden in HIDDEN:
        for rows in ROWS:
            x = torch.randn(rows, hidden, dtype=torch.bfloat16, device=device)
            y, rstd = l2norm_fwd(x)
            l2norm_bwd(y, rstd, torch.ones_like(y))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    run(p.parse_args().device)
