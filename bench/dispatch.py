"""Python cost of a launch up to the driver call: tritonwarm's fast dispatch vs Triton's own
``kernel[grid](...)``, on the same inputs, in one run; then the host cost of a small call through
each layer of the library (launch spec, ``JitKernel``, the public launcher, the
``torch.ops.tritonwarm`` op, and the same op registered with ``torch.library.custom_op``) against
torch's own eager call of a comparable op (``F.rms_norm``) and one eager ``add_``, on the same inputs.

    python bench/dispatch.py [--calls 20000] [--repeat 5] [--json PATH]
    python bench/dispatch.py --gpu [--calls 5000] [--json PATH]

No GPU is needed: both paths run under the target-only driver (sm90) with the compiled kernel's
driver launch replaced by a no-op, so what is timed is exactly the Python each path runs before
the driver would take over. The CPU-tensor check that sends CPU launches to Triton's interpreter
is bypassed while timing (every tensor is on the CPU); on a GPU it is one attribute read. Without
a GPU, torch's eager baselines run on the same CPU tensors, their compute included (a few µs at one
token; ``meta`` tensors are no fair stand-in: their Python meta kernels cost more than the CPU op).

With ``--gpu`` the same script times the real thing on this machine's GPU: real launches, torch's
eager ops on the GPU, the device synchronized before and after each timed loop. Either way every
path's output is first checked once against a plain PyTorch reference (on the CPU through Triton's
interpreter, before the launch is stubbed); a path whose output is wrong is reported WRONG and not
timed, and a path that fails prints one line and the run goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import tempfile
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import save_json, table  # noqa: E402
from _dispatch_kernels import args5_kernel, args20_kernel  # noqa: E402
from tritonwarm.jit import TARGETS, JitKernel, Launch  # noqa: E402
from tritonwarm.jit.cache.triton_dir import triton_cache_dir  # noqa: E402
from tritonwarm.jit.core import kernel as kernel_module  # noqa: E402
from tritonwarm.jit.core.targets import target_driver  # noqa: E402

CHECKED = ("launchers.rms_norm", "torch.ops.tritonwarm.rms_norm", "same op via torch.library.custom_op")
HIDDEN, INTER = 2048, 1408  # one decode token of DeepSeek-V2-Lite: hidden size, expert intermediate size


class Wrong(Exception):
    """A path's output differs from the reference: reported WRONG, not timed."""


def failure(what: str, exc: BaseException) -> str:
    """One line naming the path and the error, printed at once (the run goes on)."""
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" ({os.path.basename(last[0].filename)}:{last[0].lineno})" if last else ""
    line = f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}{where}"
    print(f"FAILED {line}", file=sys.stderr, flush=True)
    return line


def close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    a, e = actual.float().cpu(), expected.float().cpu()
    if a.shape != e.shape:
        raise Wrong(f"{what}: shape {tuple(a.shape)}, expected {tuple(e.shape)}")
    err = (a - e).abs().max().item()
    if not err <= 2e-2 * max(e.abs().max().item(), 1.0):
        raise Wrong(f"{what}: max abs error {err:.3g}")


@contextlib.contextmanager
def no_interpreter(gpu: bool):
    """On the CPU the launches are stubbed: keep CPU tensors from taking the interpreter while timing."""
    if gpu:
        yield
        return
    saved = kernel_module._wants_interpreter
    kernel_module._wants_interpreter = lambda launch_args: False
    try:
        yield
    finally:
        kernel_module._wants_interpreter = saved


def timed(fn, calls: int, repeat: int, gpu: bool) -> float:
    """Best of ``repeat`` loops of ``calls`` calls, µs per call (on a GPU the queue drained around each loop)."""
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    for _ in range(min(1000, calls)):
        fn()
    best = float("inf")
    for _ in range(repeat):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


# ---------------------------------------------------------------- fast dispatch vs kernel[grid]

def launches(device: str):
    """(name, kernel, launch, expected output index and value) for the two dispatch kernels."""
    n = 4096
    t = [torch.randn(n, device=device) for _ in range(6)]
    x, y = torch.randn(n, device=device), torch.randn(n, device=device)  # its own: the 20-argument one reads t
    five = Launch((4,), (x, y, n, 1, 2.0), {"BLOCK": 1024}, num_warps=4)
    twenty = Launch((4,), (*t, n, 1, 1, 1, 1, 1, 3, 5, 7, 9, 0.5, 1.5, 2.5, 3.5), {"BLOCK": 1024}, num_warps=4)
    five_ref = x * 2.0
    twenty_ref = t[0] * 0.5 + t[1] * 1.5 + t[2] * 2.5 + t[3] * 3.5 + t[4] + (3 + 5 + 7 + 9)
    return [("5 arguments", args5_kernel, five, y, five_ref),
            ("20 arguments", args20_kernel, twenty, t[5], twenty_ref)]


def compare(name, jit_function, launch: Launch, out, ref, calls: int, repeat: int, gpu: bool) -> dict:
    ours = JitKernel(jit_function, lambda: launch, name=f"bench.{jit_function.__name__}")
    out.fill_(0.5)
    ours.launch(launch)  # the interpreter on the CPU, the GPU with --gpu
    close(out, ref, name)
    kwargs = launch.kwargs()
    with no_interpreter(gpu):
        kernel = jit_function.run(*launch.args, grid=launch.grid, warmup=not gpu, **kwargs)  # compile once
        if not gpu:  # no driver: both paths end in the same no-op "launch"
            kernel._run, kernel.function, kernel.module = (lambda *a: None), 0, object()
        triton_launch = jit_function[launch.grid]
        ours.launch(launch)  # the first call takes Triton's path and remembers the kernel
        if ours.fast.chosen_kernel(launch) is not kernel:
            raise Wrong("the fast path must pick Triton's kernel")
        triton_us = timed(lambda: triton_launch(*launch.args, **kwargs), calls, repeat, gpu)
        ours_us = timed(lambda: ours.launch(launch), calls, repeat, gpu)
        spec_us = timed(lambda: ours(), calls, repeat, gpu)
    return {"kernel": name, "triton_us": triton_us, "fast_dispatch_us": ours_us, "ratio": ours_us / triton_us,
            "with_launch_spec_us": spec_us, "check": "ok"}


# ---------------------------------------------------------------- host cost of one small call

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


def _do_nothing_ops():
    """Two ops whose Python kernel only allocates the output: what the dispatcher itself costs around
    a Python kernel on this device, registered as the library's ops are, and with the autograd and
    in-place-or-view layers falling through (a candidate registration)."""
    lib = torch.library.Library("tritonwarm_bench_empty", "DEF")
    schema = "(Tensor x, Tensor weight, float eps, Tensor(a!)? residual) -> Tensor"

    def empty(x, weight, eps, residual):
        return torch.empty_like(x)

    lib.define("composite" + schema)
    lib.impl("composite", empty, "CompositeExplicitAutograd")
    lib.define("fallthrough" + schema)
    lib.impl("fallthrough", empty, "CompositeExplicitAutograd")
    for key in ("Autograd", "ADInplaceOrView"):
        lib.impl("fallthrough", torch.library.fallthrough_kernel, key)
    ops = torch.ops.tritonwarm_bench_empty
    return lib, ops.composite.default, ops.fallthrough.default


_KEEP: list = []  # libraries stay alive as long as their ops are timed


def host_cases(gpu: bool):
    """Per case: (name, eager baseline name, eager call, inputs to stub, [(path, call, output check or None)])."""
    import importlib

    import torch.nn.functional as F

    norm = importlib.import_module("tritonwarm.launchers.rms_norm")
    act = importlib.import_module("tritonwarm.launchers.activation")
    from tritonwarm.kernels.activation import silu_and_mul_reference
    from tritonwarm.kernels.rms_norm import rms_norm_reference

    device = "cuda" if gpu else "cpu"
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(1, HIDDEN, device=device, dtype=torch.bfloat16, generator=gen)
    w = torch.randn(HIDDEN, device=device, dtype=torch.bfloat16, generator=gen)
    g = torch.randn(1, 2 * INTER, device=device, dtype=torch.bfloat16, generator=gen)
    out = torch.empty_like(x)
    norm_ref, silu_ref = rms_norm_reference(x, w, 1e-6), silu_and_mul_reference(g)

    def norm_fn(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return norm.rms_norm(x, weight, eps)

    def silu_fn(x: torch.Tensor) -> torch.Tensor:
        return act.silu_and_mul(x)

    def checked(fn, ref):
        return lambda: close(fn(), ref, "output")

    # the same kernel and spec without the launch memo: the spec, a Launch and the signature on every call
    plain = JitKernel(norm.rms_norm_jit.jit_function, norm.rms_norm_launch, name="bench.rms_norm.plain")

    def jit_call_check(jit_kernel):
        def check():
            out.fill_(0.5)
            jit_kernel(x, w, out, 1e-6)
            close(out, norm_ref, "out")
        return check

    norm_twin = _custom_op_twin("rms_norm", norm_fn, lambda x, weight, eps: torch.empty_like(x))
    silu_twin = _custom_op_twin("silu_and_mul", silu_fn, lambda x: x.new_empty(x.shape[0], x.shape[1] // 2))
    norm_op, silu_op = torch.ops.tritonwarm.rms_norm, torch.ops.tritonwarm.silu_and_mul
    lib, composite, fallthrough = _do_nothing_ops()
    _KEEP.append(lib)
    norm_paths = [
        ("torch.empty_like", lambda: torch.empty_like(x), None),
        ("op, Python kernel = empty_like only", lambda: composite(x, w, 1e-6, None), None),
        ("same, autograd layers fall through", lambda: fallthrough(x, w, 1e-6, None), None),
        ("launch spec", lambda: norm.rms_norm_launch(x, w, out, 1e-6), None),
        ("JitKernel call, no launch memo", lambda: plain(x, w, out, 1e-6), jit_call_check(plain)),
        ("JitKernel call (memoized launch)", lambda: norm.rms_norm_jit(x, w, out, 1e-6),
         jit_call_check(norm.rms_norm_jit)),
        ("launchers.rms_norm", lambda: norm.rms_norm(x, w, 1e-6), None),
        ("torch.ops.tritonwarm.rms_norm", lambda: norm_op(x, w, 1e-6, None), None),
        ("same op via torch.library.custom_op", lambda: norm_twin(x, w, 1e-6), None),
    ]
    silu_paths = [
        ("launchers.silu_and_mul", lambda: act.silu_and_mul(g), None),
        ("torch.ops.tritonwarm.silu_and_mul", lambda: silu_op(g), None),
        ("same op via torch.library.custom_op", lambda: silu_twin(g), None),
    ]
    # a path that returns its output is checked on what it returns
    norm_paths = [(p, fn, check or (checked(fn, norm_ref) if p in CHECKED else None))
                  for p, fn, check in norm_paths]
    silu_paths = [(p, fn, check or checked(fn, silu_ref)) for p, fn, check in silu_paths]
    stubs = [(norm.rms_norm_jit, (x, w, out, 1e-6)), (plain, (x, w, out, 1e-6)),
             (act.silu_and_mul_jit, (g, g.new_empty(1, INTER)))]
    return [
        (f"rms_norm 1x{HIDDEN} bf16", "F.rms_norm", lambda: F.rms_norm(x, (HIDDEN,), w, 1e-6),
         checked(lambda: F.rms_norm(x, (HIDDEN,), w, 1e-6), norm_ref), norm_paths),
        (f"silu_and_mul 1x{INTER} bf16", "F.silu (same input)", lambda: F.silu(g), None, silu_paths),
    ], stubs


def host_rows(gpu: bool, calls: int, repeat: int, errors: list) -> list[dict]:
    """One row per (case, path): µs per call, against the case's eager op and one eager ``add_``."""
    device = "cuda" if gpu else "cpu"
    cases, stubs = host_cases(gpu)
    # checks first, before any launch is stubbed (on the CPU they run in Triton's interpreter)
    status: dict[tuple[str, str], str] = {}
    for case, eager_name, _, eager_check, paths in cases:
        for path, _, check in [(eager_name, None, eager_check), *paths]:
            if check is None:
                status[(case, path)] = "-"
                continue
            try:
                check()
                status[(case, path)] = "ok"
            except Wrong as e:
                status[(case, path)] = "WRONG"
                errors.append(failure(f"{case} / {path}", e))
            except Exception as e:  # noqa: BLE001 - one line, and the run goes on
                status[(case, path)] = "FAILED"
                errors.append(failure(f"{case} / {path}", e))
    scratch = torch.randn(1, HIDDEN, device=device, dtype=torch.bfloat16)  # add_ grows it: not an input
    rows = []
    with no_interpreter(gpu):
        if not gpu:
            for jit_kernel, inputs in stubs:
                stub_launch(jit_kernel, *inputs)
        add_us = timed(lambda: scratch.add_(1), calls, repeat, gpu)
        for case, eager_name, eager, _, paths in cases:
            try:
                eager_us = timed(eager, calls, repeat, gpu)
            except Exception as e:  # noqa: BLE001
                errors.append(failure(f"{case} / {eager_name}", e))
                continue
            rows.append(dict(case=case, path=f"{eager_name} (torch eager, {device})", us=eager_us, vs_eager=1.0,
                             vs_add=eager_us / add_us, check=status[(case, eager_name)]))
            if case.startswith("rms_norm"):
                rows.append(dict(case=case, path="one eager add_ (1x2048 bf16)", us=add_us,
                                 vs_eager=add_us / eager_us, vs_add=1.0, check="-"))
            for path, fn, _ in paths:
                row = dict(case=case, path=path, us=None, vs_eager=None, vs_add=None, check=status[(case, path)])
                rows.append(row)
                if row["check"] in ("WRONG", "FAILED"):
                    continue
                try:
                    us = timed(fn, calls, repeat, gpu)
                except Exception as e:  # noqa: BLE001
                    row["check"] = "FAILED"
                    errors.append(failure(f"{case} / {path}", e))
                    continue
                row.update(us=us, vs_eager=us / eager_us, vs_add=us / add_us)
    return rows


def _fmt(value, digits=2):
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=None, help="calls per timed loop (default 20000; 5000 with --gpu)")
    p.add_argument("--repeat", type=int, default=5, help="timed loops per path: the best one counts")
    p.add_argument("--gpu", action="store_true", help="real launches on this machine's GPU")
    p.add_argument("--json", metavar="PATH", help="write every measured figure here as one JSON object")
    args = p.parse_args()
    calls = args.calls or (5000 if args.gpu else 20000)
    if args.gpu and not torch.cuda.is_available():
        raise SystemExit("--gpu: torch sees no GPU here (run without --gpu for the stubbed-driver timing)")
    import triton

    command = f"python bench/dispatch.py --calls {calls} --repeat {args.repeat}{' --gpu' if args.gpu else ''}"
    errors: list[str] = []
    dispatch: list[dict] = []
    host: list[dict] = []
    with tempfile.TemporaryDirectory() as cache, triton_cache_dir(cache):
        device = "cuda" if args.gpu else "cpu"
        with contextlib.nullcontext() if args.gpu else target_driver(TARGETS["sm90"]):
            for name, fn, launch, out, ref in launches(device):
                try:
                    dispatch.append(compare(name, fn, launch, out, ref, calls, args.repeat, args.gpu))
                except Wrong as e:
                    errors.append(failure(name, e))
                    dispatch.append({"kernel": name, "check": "WRONG"})
                except Exception as e:  # noqa: BLE001 - one line, and the run goes on
                    errors.append(failure(name, e))
                    dispatch.append({"kernel": name, "check": "FAILED"})
            try:
                host = host_rows(args.gpu, calls, args.repeat, errors)
            except Exception as e:  # noqa: BLE001
                errors.append(failure("host cost", e))

    where = torch.cuda.get_device_name() if args.gpu else "no GPU: driver call stubbed"
    result = {
        "command": command, "device": where, "gpu": args.gpu, "calls": calls, "repeat": args.repeat,
        "triton": triton.__version__, "torch": torch.__version__, "python": platform.python_version(),
        "dispatch": dispatch, "host": host, "errors": errors,
    }
    save_json(args.json, result)
    table(f"Dispatch overhead per launch, µs (Triton {triton.__version__}, {where})",
          ["kernel", "Triton kernel[grid](...)", "tritonwarm fast dispatch", "ratio", "tritonwarm incl. launch spec",
           "check"],
          [[r["kernel"], _fmt(r.get("triton_us")), _fmt(r.get("fast_dispatch_us")), _fmt(r.get("ratio")),
            _fmt(r.get("with_launch_spec_us")), r["check"]] for r in dispatch], command)
    eager = "on the GPU" if args.gpu else "on the CPU, their compute included; ours: driver call stubbed"
    table(f"Host cost of one small call, µs, against torch's eager op and one eager add_ ({eager})",
          ["case", "path", "µs per call", "vs eager op", "vs add_", "check"],
          [[r["case"], r["path"], _fmt(r["us"]), _fmt(r["vs_eager"]), _fmt(r["vs_add"]), r["check"]] for r in host],
          command)
    if errors:
        print(f"\n{len(errors)} path(s) failed or were wrong (see above; not timed)")


if __name__ == "__main__":
    main()
