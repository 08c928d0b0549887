"""Python cost of a launch up to the driver call: tritonwarm's fast dispatch vs Triton's own
``kernel[grid](...)``, on the same inputs, in one run; then the host cost of a small call through
each layer of the library (launch spec, ``JitKernel``, the public launcher, the
``torch.ops.tritonwarm`` op, and the same op registered with ``torch.library.custom_op``) against
torch's own eager call of a comparable op, on the same inputs.

    python bench/dispatch.py [--calls 20000] [--repeat 5]

No GPU is needed: both paths run under the target-only driver (sm90) with the compiled kernel's
driver launch replaced by a no-op, so what is timed is exactly the Python each path runs before
the driver would take over. The CPU-tensor check that sends CPU launches to Triton's interpreter
is bypassed here (every tensor is on the CPU); on a GPU it is one environment lookup and one
attribute read. Without a GPU, torch's eager baseline runs on the same CPU tensors, its compute
included (a few µs at one token; ``meta`` tensors are no fair stand-in: their Python meta kernels
cost more than the CPU op). On a GPU the same script times the
real thing: see --gpu.
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


def stub_launch(jit_kernel, *inputs) -> None:
    """Compile ``jit_kernel`` for these inputs under the target-only driver and make its driver call a no-op."""
    launch = jit_kernel.launch_spec(*inputs)
    kernel = jit_kernel.jit_function.run(*launch.args, grid=launch.grid, warmup=True, **launch.kwargs())
    kernel._run, kernel.function, kernel.module = (lambda *a: None), 0, object()
    jit_kernel.launch(launch)  # Triton's path once: the fast path remembers the kernel


def _custom_op_twin(name: str, fn, fake):
    """The same launcher registered through ``torch.library.custom_op`` (the costlier path), for comparison."""
    op = torch.library.custom_op(f"tritonwarm_bench::{name}", fn, mutates_args=())
    op.register_fake(fake)
    return getattr(torch.ops.tritonwarm_bench, name)


def host_rows(gpu: bool, calls: int, repeat: int):
    """(case, µs, ratio vs torch eager) for a one-token rms_norm and silu_and_mul."""
    import importlib

    import torch.nn.functional as F

    norm = importlib.import_module("tritonwarm.launchers.rms_norm")
    act = importlib.import_module("tritonwarm.launchers.activation")
    device = "cuda" if gpu else "cpu"
    x = torch.randn(1, 2048, device=device, dtype=torch.bfloat16)
    w = torch.randn(2048, device=device, dtype=torch.bfloat16)
    g = torch.randn(1, 2 * 1408, device=device, dtype=torch.bfloat16)
    out = torch.empty_like(x)
    if not gpu:
        stub_launch(norm.rms_norm_jit, x, w, out, 1e-6)
        stub_launch(act.silu_and_mul_jit, g, g.new_empty(1, 1408))

    def norm_fn(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return norm.rms_norm(x, weight, eps)

    def silu_fn(x: torch.Tensor) -> torch.Tensor:
        return act.silu_and_mul(x)

    norm_twin = _custom_op_twin("rms_norm", norm_fn, lambda x, weight, eps: torch.empty_like(x))
    silu_twin = _custom_op_twin("silu_and_mul", silu_fn, lambda x: x.new_empty(x.shape[0], x.shape[1] // 2))
    norm_op, silu_op = torch.ops.tritonwarm.rms_norm, torch.ops.tritonwarm.silu_and_mul
    cases = [
        ("rms_norm 1x2048 bf16", lambda: F.rms_norm(x, (2048,), w, 1e-6), [
            ("one eager x.add_(1)", lambda: x.add_(1)),
            ("torch.empty_like", lambda: torch.empty_like(x)),
            ("launch spec", lambda: norm.rms_norm_launch(x, w, out, 1e-6)),
            ("JitKernel call", lambda: norm.rms_norm_jit(x, w, out, 1e-6)),
            ("launchers.rms_norm", lambda: norm.rms_norm(x, w, 1e-6)),
            ("torch.ops.tritonwarm.rms_norm", lambda: norm_op(x, w, 1e-6, None)),
            ("same op via torch.library.custom_op", lambda: norm_twin(x, w, 1e-6)),
        ]),
        ("silu_and_mul 1x1408 bf16", lambda: F.silu(g), [
            ("launchers.silu_and_mul", lambda: act.silu_and_mul(g)),
            ("torch.ops.tritonwarm.silu_and_mul", lambda: silu_op(g)),
            ("same op via torch.library.custom_op", lambda: silu_twin(g)),
        ]),
    ]
    rows = []
    for case, eager, ours in cases:
        eager_us = timed(eager, calls, repeat)
        rows.append([case, f"torch eager ({'F.rms_norm' if 'rms' in case else 'F.silu'}, {device})",
                     f"{eager_us:.2f}", "1.00"])
        for name, fn in ours:
            us = timed(fn, calls, repeat)
            rows.append([case, name, f"{us:.2f}", f"{us / eager_us:.2f}"])
    return rows


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
            host = host_rows(args.gpu, args.calls, args.repeat)
    import triton

    where = "GPU" if args.gpu else "no GPU: driver call stubbed"
    table(f"Dispatch overhead per launch, µs (Triton {triton.__version__}, {where})",
          ["kernel", "Triton kernel[grid](...)", "tritonwarm fast dispatch", "ratio", "tritonwarm incl. launch spec"],
          rows, f"python bench/dispatch.py --calls {args.calls} --repeat {args.repeat}{' --gpu' if args.gpu else ''}")
    eager = "on the GPU" if args.gpu else "on the CPU, its compute included; ours: driver call stubbed"
    table(f"Host cost of one small call, µs, against torch's eager call ({eager})",
          ["case", "path", "µs per call", "vs torch eager"],
          host, f"python bench/dispatch.py --calls {args.calls} --repeat {args.repeat}{' --gpu' if args.gpu else ''}")


if __name__ == "__main__":
    main()
