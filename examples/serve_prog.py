"""A small program that serves a few requests through the third-party-style ops; it runs on a GPU, or on
meta tensors (``--device meta``) under ``tritonwarm record --target T``.

    PYTHONPATH=.. python -m tritonwarm record -o /tmp/prog.plan.yaml --target sm90 -- \\
        python -m tritonwarm.examples.serve_prog --device meta
    PYTHONPATH=.. python -m tritonwarm warmup /tmp/prog.plan.yaml --target gfx942
"""

from __future__ import annotations

import argparse

import torch

from .thirdparty_ops import mlp_block


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batches", default="1,7,64")
    args = p.parse_args(argv)
    bias = torch.randn(args.hidden, dtype=torch.bfloat16, device=args.device)
    for tokens in map(int, args.batches.split(",")):
        x = torch.randn(tokens, args.hidden, dtype=torch.bfloat16, device=args.device)
        mlp_block(x, bias)


if __name__ == "__main__":
    main()
