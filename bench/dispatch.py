"""Python cost of a launch up to the driver call: tritonwarm's fast dispatch vs Triton's own
``kernel[grid](...)``, on the same inputs, in one run.

    python bench/dispatch.py [--calls 20000] [--repeat 5]

No GPU is needed: both paths run under the target-only driver (sm90) with the compiled kernel's
driver launch replaced by a no-op, so what is timed is exactly the Python each path runs before
the driver would take over. The CPU-tensor check that sends CPU launches to Triton's interpreter
is bypassed here (every tensor is on the CPU); on a GPU it is one environment lookup and one
attribute read. On a GPU the same script times the real thing: see --gpu.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import table  # noqa: E402
from _dispatch_kernels import args5_kernel, args20_kernel  # noqa: E402

from tritonwarm.jit import TARGETS, JitKernel, Launch  # noqa: E402
from tritonwarm.jit import kernel as kernel_module  # noqa: E402
from tritonwarm.jit.compile import triton_cache_dir  # noqa: E402
from tritonwarm.jit.targets import target_driver  # noqa: E402


def launches(device: str):
    n = 4096
    t = [torch.empty(n, device=device) for _ in range(6)]
    five = Launch((4,), (t[0], t[1], n, 1, 2.0), {"BLOCK": 1024}, num_warps=4)
    twenty = Launch((4,), (*t, n, 1, 1, 1, 1, 1, 3, 5, 7, 9, 0.5, 1.5, 2.5, 3.5), {"BLOCK": 1024}, num_warps=4)
    return [("5 arguments", args5_kernel, five), ("20 arguments", args20_kernel, twenty)]


def timed(fn, calls: int, repeat: int) -> float:
    for _ in range(1000):
        fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def compare(jit_function, launch: Launch, calls: int, repeat: int, gpu: bool):
    ours = JitKernel(jit_function, lambda: launch, name=f"bench.{jit_function.__name__}")
    kwargs = launch.kwargs()
    kernel = jit_function.run(*launch.args, grid=launch.grid, warmup=not gpu, **kwargs)  # compile once
    if not gpu:  # no driver: both paths end in the same no-op "launch"
        kernel._run, kernel.function, kernel.module = (lambda *a: None), 0, object()
    triton_launch = jit_function[launch.grid]
    ours.launch(launch)  # the first call takes Triton's path and remembers the kernel
    assert ours.fast.chosen_kernel(launch) is kernel, "the fast path must pick Triton's kernel"
    triton_us = timed(lambda: triton_launch(*launch.args, **kwargs), calls, repeat)
    ours_us = timed(lambda: ours.launch(launch), calls, repeat)
    spec_us = timed(lambda: ours(), calls, repeat)
    return triton_us, ours_us, spec_us


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--gpu", action="store_true", help="real launches on this machine's GPU")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as cache, triton_cache_dir(cache):
        device = "cuda" if args.gpu else "cpu"
        if not args.gpu:
            kernel_module._wants_interpreter = lambda launch_args: False
        with contextlib.nullcontext() if args.gpu else target_driver(TARGETS["sm90"]):
            for name, fn, launch in launches(device):
                triton_us, ours_us, spec_us = compare(fn, launch, args.calls, args.repeat, args.gpu)
                rows.append([name, f"{triton_us:.2f}", f"{ours_us:.2f}", f"{ours_us / triton_us:.2f}",
                             f"{spec_us:.2f}"])
    import triton

    table(f"Dispatch overhead per launch, µs (Triton {triton.__version__}, {'GPU' if args.gpu else 'no GPU: driver call stubbed'})",
          ["kernel", "Triton kernel[grid](...)", "tritonwarm fast dispatch", "ratio", "tritonwarm incl. launch spec"],
          rows, f"python bench/dispatch.py --calls {args.calls} --repeat {args.repeat}{' --gpu' if args.gpu else ''}")


if __name__ == "__main__":
    main()
