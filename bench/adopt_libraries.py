"""Adopting unmodified Triton kernel libraries from the package index: how many of the keys a server
asks for each way of adopting them warms, and what the warm-up costs.

For each library (liger-kernel: RMSNorm and SwiGLU; fla-core: the autotuned L2-norm), forward and
backward, and each target (sm90, gfx942):

- judge: the library's own functions called by an ordinary program (``examples/adopt_<lib>_prog.py``)
  on real tensors, in a fresh process per target that imports the library under the target's answers,
  with host code seeing what it sees on a GPU (``x.device.type == "cuda"``, ``is_cuda``, the target's
  SM/CU count). Plain Triton computes every key (its own binder, its ``jit_cache_hook``); nothing runs.
  An autotuned kernel counts every config (a server asks for the one it picks).
- spec path: ``tritonwarm warmup examples/adopt_<lib>.yaml`` (``capture: all``, no glue);
- record path: ``tritonwarm record --target T`` of that program (a dry run), then ``warmup PLAN``.

Keys hit: the judge's keys whose entries the warmed cache holds. ``check`` is what ``tritonwarm check``
says of the same cache: "ok" where keys are missed is a silent miss. Lines: what the user wrote
(spec lines without comments; the record path writes none). Warm-up: wall time of the command,
and its compile phase (``--jobs 2``).

    python -m venv --system-site-packages /tmp/adoptvenv
    /tmp/adoptvenv/bin/pip install --no-deps liger-kernel fla-core einops
    PYTHONPATH=.. /tmp/adoptvenv/bin/python bench/adopt_libraries.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = {"liger": "liger_kernel", "fla": "fla"}
TARGETS = ("sm90", "gfx942")


# --------------------------------------------------------------------------- the judge (its own process)


@contextlib.contextmanager
def _as_on_a_gpu():
    """Real CPU tensors that host code sees as the GPU's: ``device.type == "cuda"``, ``is_cuda``; a
    factory or ``.to`` asked for ``cuda`` makes a CPU tensor; ``torch.cuda.device(...)`` is a no-op."""
    import torch
    from torch.overrides import TorchFunctionMode

    class CudaLooking(torch.Tensor):
        @property
        def device(self):
            return torch.device("cuda", 0)

        @property
        def is_cuda(self):
            return True

    def on_cpu(value):
        if isinstance(value, torch.device) and value.type == "cuda":
            return torch.device("cpu")
        if isinstance(value, str) and value.startswith("cuda"):
            return "cpu"
        return value

    def looking(value):
        if isinstance(value, torch.Tensor) and not isinstance(value, CudaLooking):
            return value.as_subclass(CudaLooking)
        if isinstance(value, (tuple, list)):
            return type(value)(looking(v) for v in value)
        return value

    class OnCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            args = tuple(on_cpu(a) for a in args)
            kwargs = {k: on_cpu(v) for k, v in (kwargs or {}).items()}
            return looking(func(*args, **kwargs))

    saved = torch.cuda.device, torch.cuda.is_available
    torch.cuda.device, torch.cuda.is_available = lambda device=None: contextlib.nullcontext(), lambda: True
    try:
        with OnCpu():
            yield
    finally:
        torch.cuda.device, torch.cuda.is_available = saved


def judge(lib: str, target_name: str) -> list[list[str]]:
    """The keys plain Triton computes for the program's launches on ``target_name``: (kernel, cache hash,
    entry folder, entry name) each."""
    import importlib

    from tritonwarm.jit import TARGETS as ALL
    from tritonwarm.jit.trace import Capture, tracing

    cap = Capture()
    with tracing(cap, ALL[target_name], all_kernels=True), _as_on_a_gpu():
        program = importlib.import_module(f"tritonwarm.examples.adopt_{lib}_prog")  # imports the library here
        program.run("cuda")
    return sorted([v.kernel, v.cache_hash, v.entry_dir, v.entry_name] for v in cap.variants.values())


# --------------------------------------------------------------------------- the table


def _cli(*args, env, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tritonwarm", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT.parent)


def _spec_lines(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#"))


def _hits(keys: list[list[str]], cache: Path) -> int:
    from tritonwarm.jit.cache import entry_files

    return sum(1 for _, _, entry_dir, name in keys if entry_files(cache, entry_dir, name) is not None)


def _warm(spec: Path, target: str, cache: Path, env) -> tuple[float, float, str]:
    start = time.perf_counter()
    proc = _cli("warmup", spec, "--target", target, "--cache-dir", cache, "--jobs", "2", "--json", env=env)
    wall = time.perf_counter() - start
    try:
        compile_seconds = json.loads(proc.stdout)["seconds"]
    except (ValueError, KeyError):
        return wall, float("nan"), f"warmup failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}"
    return wall, compile_seconds, "" if proc.returncode == 0 else "warm-up reported problems"


def _check(spec: Path, target: str, cache: Path, env) -> str:
    proc = _cli("check", spec, "--target", target, "--cache-dir", cache, "--json", env=env)
    try:
        report = json.loads(proc.stdout)["targets"][0]
    except (ValueError, KeyError, IndexError):
        return "error"
    return "ok" if not report["missing"] else f"{len(report['missing'])} missing"


def table(libs, targets) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="tritonwarm-adopt-") as tmp:
        env = {**os.environ, "TRITONWARM_CACHE_DIR": str(Path(tmp, "store")), "TRITON_CACHE_DIR": str(Path(tmp, "tc")),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT.parent), os.environ.get("PYTHONPATH")]))}
        for lib in libs:
            spec = ROOT / "examples" / f"adopt_{lib}.yaml"
            for target in targets:
                judged = subprocess.run([sys.executable, __file__, "--judge", lib, target], capture_output=True,
                                        text=True, env=env, timeout=600)
                if judged.returncode != 0:
                    raise SystemExit(f"judge {lib} {target} failed: {judged.stderr.strip().splitlines()[-1:]}")
                keys = json.loads(judged.stdout.strip().splitlines()[-1])
                plan = Path(tmp, f"{lib}-{target}.plan.yaml")
                recorded = _cli("record", "-o", plan, "--target", target, "--", sys.executable, "-m",
                                f"tritonwarm.examples.adopt_{lib}_prog", "--device", "meta", env=env)
                for path, source, lines in (("spec", spec, _spec_lines(spec)), ("record", plan, 0)):
                    cache = Path(tmp, f"{lib}-{target}-{path}")
                    if path == "record" and recorded.returncode != 0:
                        note = (recorded.stderr.strip().splitlines() or ["record failed"])[-1]
                        rows.append(dict(lib=lib, target=target, path=path, requested=len(keys), hit=0, check="-",
                                         lines=lines, wall=float("nan"), compile=float("nan"), note=note))
                        continue
                    wall, compile_seconds, note = _warm(source, target, cache, env)
                    rows.append(dict(lib=lib, target=target, path=path, requested=len(keys), hit=_hits(keys, cache),
                                     check=_check(source, target, cache, env), lines=lines, wall=wall,
                                     compile=compile_seconds, note=note))
                    print(_format(rows[-1]), file=sys.stderr, flush=True)
    return rows


HEADER = ("| library | target | path | keys requested | keys hit | `check` says | lines written | "
          "warm-up wall s | compile phase s |")


def _format(r: dict) -> str:
    note = f" {r['note']}" if r["note"] else ""
    return (f"| {r['lib']} | {r['target']} | {r['path']} | {r['requested']} | {r['hit']} | {r['check']} | "
            f"{r['lines']} | {r['wall']:.1f} | {r['compile']:.1f}{note} |")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--libs", default=",".join(LIBRARIES), help=f"of {', '.join(LIBRARIES)}")
    p.add_argument("--targets", default=",".join(TARGETS))
    p.add_argument("--judge", nargs=2, metavar=("LIB", "TARGET"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.judge:
        print(json.dumps(judge(*args.judge)))
        return
    libs = args.libs.split(",")
    for lib in libs:
        try:
            __import__(LIBRARIES[lib])
        except ImportError:
            raise SystemExit(f"{lib}: not installed here ({__doc__.split('    ')[-1].strip()})") from None
    rows = table(libs, args.targets.split(","))
    print(HEADER)
    print("|" + "---|" * HEADER.count(" |"))
    for r in rows:
        print(_format(r))


if __name__ == "__main__":
    main()
