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
- dry-run record: ``tritonwarm record --target T`` of that program (``--device meta``: its tensors are
  seen as the server's ``cuda`` ones), then ``warmup PLAN``;
- server record: the judge's own launches recorded as ``tritonwarm record`` records them on the GPU
  server (real launches watched), then ``warmup PLAN``: the adoption loop's first step.

Keys hit: the judge's keys whose entries the warmed cache holds. ``check`` is what ``tritonwarm check``
says of the same cache: "ok" where keys are missed is a silent miss. Lines: what the user wrote
(spec lines without comments; a record writes none). Warm-up: wall time of one ``warmup`` of both
targets, and its compile phase (``--jobs 2``).

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

    cuda = torch.device("cuda", 0)  # made before the mode: inside it ``torch.device`` is a torch function too

    class CudaLooking(torch.Tensor):
        @property
        def device(self):
            return cuda

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
            if func is torch.device:  # host code naming the device it asked for: cuda
                return func(*args, **(kwargs or {}))
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


def judge(lib: str, target_name: str, server_plan: str) -> list[list[str]]:
    """The keys plain Triton computes for the program's launches on ``target_name``: (kernel, cache hash,
    entry folder, entry name) each. The same launches recorded as the server would record them
    (``tritonwarm record`` on the GPU: real launches watched) are written to ``server_plan``."""
    import importlib

    from tritonwarm.jit import TARGETS as ALL
    from tritonwarm.jit.adopt.record import read_record, recording, write_plan
    from tritonwarm.jit.core.trace import Capture, tracing

    cap = Capture()
    record = f"{server_plan}.jsonl"
    with tracing(cap, ALL[target_name], all_kernels=True), _as_on_a_gpu(), recording(record):
        program = importlib.import_module(f"tritonwarm.examples.adopt_{lib}_prog")  # imports the library here
        program.run("cuda")
    recorded = read_record(record)
    write_plan(recorded.rows, server_plan, [f"adopt_{lib}_prog"], None, recorded.roots)
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


def _for_target(plan: Path, target: str) -> Path:
    """A plan recorded for one target, warmed for that target only (``targets:``)."""
    plan.write_text(plan.read_text() + f"targets: [{target}]\n")
    return plan


def _warm_and_check(sources: list[Path], targets, cache: Path, env) -> tuple[float, float, dict[str, str], str]:
    """One warm-up of every target (``--jobs 2``): its wall time, its compile phase, what ``check`` says."""
    start = time.perf_counter()
    proc = _cli("warmup", *sources, "--target", ",".join(targets), "--cache-dir", cache, "--jobs", "2", "--json",
                env=env)
    wall = time.perf_counter() - start
    try:
        compile_seconds, note = json.loads(proc.stdout)["seconds"], ""
    except (ValueError, KeyError):
        compile_seconds, note = float("nan"), (proc.stderr.strip().splitlines() or ["warm-up failed"])[-1]
    checked = _cli("check", *sources, "--target", ",".join(targets), "--cache-dir", cache, "--json", env=env)
    says = {}
    try:
        for report in json.loads(checked.stdout)["targets"]:
            says[report["target"]] = "ok" if not report["missing"] else f"{len(report['missing'])} missing"
    except (ValueError, KeyError):
        pass
    return wall, compile_seconds, says, note


def table(libs, targets) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="tritonwarm-adopt-") as tmp:
        env = {**os.environ, "TRITONWARM_CACHE_DIR": str(Path(tmp, "store")), "TRITON_CACHE_DIR": str(Path(tmp, "tc")),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT.parent), os.environ.get("PYTHONPATH")]))}
        for lib in libs:
            spec = ROOT / "examples" / f"adopt_{lib}.yaml"
            keys, sources = {}, {"spec": [spec], "dry-run record": [], "server record": []}
            notes = {"spec": "", "dry-run record": "", "server record": ""}
            for target in targets:
                server = Path(tmp, f"{lib}-{target}.server.plan.yaml")
                judged = subprocess.run([sys.executable, __file__, "--judge", lib, target, server],
                                        capture_output=True, text=True, env=env, timeout=600)
                if judged.returncode != 0:
                    raise SystemExit(f"judge {lib} {target} failed: {judged.stderr.strip().splitlines()[-1:]}")
                keys[target] = json.loads(judged.stdout.strip().splitlines()[-1])
                sources["server record"].append(_for_target(server, target))
                plan = Path(tmp, f"{lib}-{target}.plan.yaml")
                recorded = _cli("record", "-o", plan, "--target", target, "--", sys.executable, "-m",
                                f"tritonwarm.examples.adopt_{lib}_prog", "--device", "meta", env=env)
                if plan.exists():
                    sources["dry-run record"].append(_for_target(plan, target))
                if recorded.returncode != 0:
                    notes["dry-run record"] = (recorded.stderr.strip().splitlines() or ["record failed"])[-1]
            for path, files in sources.items():
                cache = Path(tmp, f"{lib}-{path.replace(' ', '-')}")
                wall, compile_seconds, says, note = _warm_and_check(files, targets, cache, env) if files else (
                    float("nan"), float("nan"), {}, "")
                row = dict(lib=lib, path=path, lines=_spec_lines(spec) if path == "spec" else 0, wall=wall,
                           compile=compile_seconds, note=notes[path] or note,
                           targets={t: (_hits(keys[t], cache), len(keys[t]), says.get(t, "-")) for t in targets})
                rows.append(row)
                print(_format(row), file=sys.stderr, flush=True)
    return rows


def _header(targets) -> list[str]:
    cells = ["library", "path", "lines written"]
    cells += [c for t in targets for c in (f"{t} keys hit / requested", f"{t} `check` says")]
    cells += ["warm-up wall s", "compile phase s"]
    return ["| " + " | ".join(cells) + " |", "|" + "---|" * len(cells)]


def _format(r: dict) -> str:
    cells = [r["lib"], r["path"], str(r["lines"])]
    cells += [c for hit, requested, says in r["targets"].values() for c in (f"{hit} / {requested}", says)]
    cells += [f"{r['wall']:.1f}", f"{r['compile']:.1f}" + (f" ({r['note']})" if r["note"] else "")]
    return "| " + " | ".join(cells) + " |"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--libs", default=",".join(LIBRARIES), help=f"of {', '.join(LIBRARIES)}")
    p.add_argument("--targets", default=",".join(TARGETS))
    p.add_argument("--judge", nargs=3, metavar=("LIB", "TARGET", "SERVER_PLAN"), help=argparse.SUPPRESS)
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
    targets = args.targets.split(",")
    rows = table(libs, targets)
    print("\n".join(_header(targets)))
    for r in rows:
        print(_format(r))


if __name__ == "__main__":
    main()
