"""Do two platforms' builds of one ptxas release compile the same binaries?

Each platform's Triton wheel bundles its own build of ptxas, and Triton hashes ptxas's whole
``--version`` text into every CUDA key, build stamp included, so an aarch64 server (a GH200) never
reads a cache keyed on x86_64. ``warmup --for`` keys for the server's text while this machine's ptxas
compiles; that holds only if the two builds turn the same PTX into the same cubin. This script checks
it: the shipped warm-up plan is compiled twice, once with this machine's ptxas and once with the other
wheel's (run through qemu-user), and every cubin is compared, entry by entry (paired by their PTX).

    python bench/ptxas_builds.py --wheel triton-VERSION-cp3XX-manylinux_aarch64.whl \\
        [--target sm90 sm80] [--qemu qemu-aarch64-static] [--sysroot /usr/aarch64-linux-gnu] [--jobs 2]

Needs the other platform's wheel of this Triton release (``pip download triton==VERSION --no-deps
--only-binary=:all: --platform manylinux_2_27_aarch64 --python-version 3.XX``) and qemu-user with that
platform's C library (Debian: ``qemu-user-static libc6-arm64-cross``). No GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _common import save_json, table, tritonwarm  # noqa: E402

TOOLS = {"ptxas": "TRITON_PTXAS_PATH", "ptxas-blackwell": "TRITON_PTXAS_BLACKWELL_PATH"}


def other_ptxas(wheel: Path, folder: Path, qemu: str, sysroot: str) -> dict[str, str]:
    """The wheel's ptxas builds, each behind a script that runs it through qemu: {env var: script}."""
    env = {}
    with zipfile.ZipFile(wheel) as archive:
        for tool, variable in TOOLS.items():
            member = f"triton/backends/nvidia/bin/{tool}"
            if member not in archive.namelist():
                continue
            binary = folder / f"{tool}.bin"
            binary.write_bytes(archive.read(member))
            binary.chmod(0o755)
            script = folder / tool  # Triton names the tool by its file name in the --version text
            script.write_text(f'#!/bin/sh\nexec {qemu} -L {sysroot} {binary} "$@"\n')
            script.chmod(0o755)
            env[variable] = str(script)
    if not env:
        raise SystemExit(f"{wheel}: no ptxas in triton/backends/nvidia/bin: not a Triton wheel with the CUDA backend")
    return env


def version(tool: str) -> str:
    return subprocess.run([tool, "--version"], capture_output=True, text=True, check=True).stdout


def cubins_by_ptx(cache: Path) -> dict[str, bytes]:
    out = {}
    for ptx in cache.glob("*/*.ptx"):
        cubin = next(ptx.parent.glob("*.cubin"), None)
        if cubin is not None:
            out[hashlib.sha256(ptx.read_bytes()).hexdigest()] = cubin.read_bytes()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", required=True, type=Path, help="the other platform's wheel of this Triton")
    parser.add_argument("--target", nargs="+", default=["sm90", "sm80"])
    parser.add_argument("--qemu", default="qemu-aarch64-static")
    parser.add_argument("--sysroot", default="/usr/aarch64-linux-gnu")
    parser.add_argument("--jobs", default="2")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    if shutil.which(args.qemu) is None:
        raise SystemExit(f"{args.qemu}: not found (Debian: apt-get install qemu-user-static libc6-arm64-cross)")
    import triton
    from triton.backends.nvidia.compiler import get_ptxas
    from tritonwarm.jit.cache.env import ptxas_build

    rows, results = [], []
    with tempfile.TemporaryDirectory(prefix="tritonwarm-ptxas-") as tmp:
        tmp = Path(tmp)
        other = other_ptxas(args.wheel, tmp, args.qemu, args.sysroot)
        for target in args.target:
            arch = int(target.removeprefix("sm"))
            tool = get_ptxas(arch)
            variable = TOOLS.get(Path(tool.path).name)
            if variable not in other:
                raise SystemExit(f"{target}: this Triton compiles with {tool.path}, which {args.wheel.name} lacks")
            here, there = version(tool.path), version(other[variable])
            mine, theirs = ptxas_build(f"{here}-{arch}"), ptxas_build(f"{there}-{arch}")  # as Triton's key holds it
            if not (mine and theirs and mine["release"] == theirs["release"] and mine["build"] == theirs["build"]):
                rows.append([target, "-", "-", "-", "another ptxas release: nothing to compare"])
                continue
            caches = {}
            for side, env in (("here", {}), ("other", {variable: other[variable]})):
                caches[side] = tmp / f"{target}-{side}"
                tritonwarm("warmup", "--target", target, "--cache-dir", str(caches[side]), "--jobs", args.jobs, env=env)
            a, b = cubins_by_ptx(caches["here"]), cubins_by_ptx(caches["other"])
            paired = sorted(set(a) & set(b))
            same = sum(a[k] == b[k] for k in paired)
            rows.append([target, f"{Path(tool.path).name} {mine['release'].rsplit(' ', 1)[-1]}",
                         theirs["built"], f"{same} of {len(paired)}",
                         "identical" if same == len(paired) == len(a) == len(b) else "DIFFER"])
            results.append({"target": target, "here": here, "other": there, "paired": len(paired), "identical": same})
    table(f"Cubins of the shipped plan, this machine's ptxas against {args.wheel.name}'s (Triton "
          f"{triton.__version__})", ["target", "ptxas", "other build", "identical cubins", "verdict"], rows,
          "python bench/ptxas_builds.py --wheel " + args.wheel.name)
    save_json(args.json, results)
    return 0 if all(r[-1] == "identical" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
