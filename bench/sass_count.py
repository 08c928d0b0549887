"""SASS instructions per element of a kernel, offline: compile for an NVIDIA target under the
target-only driver (no GPU needed), disassemble the cubin with the cuobjdump Triton ships, and
count. A proxy for issue-bound kernels (fp4 quantize): fewer instructions per element, more of the
copy bandwidth. Not a timing: confirm on a GPU.

    python bench/sass_count.py [--target sm90] [--k 7168] [--variants]

Columns: instructions in the whole kernel (NOPs and the trailing BRA-to-self excluded; a straight-line
kernel has no loop, so this is what every thread issues), elements per thread, their ratio
(instructions a thread issues per element it handles),
widths of global loads / stores (LDG.E.128 = 16 bytes per thread), registers and spill (local) bytes.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _common import one_line, table  # noqa: E402

HEADER = ["kernel", "instr", "warps", "elem/thread", "instr/elem", "loads", "stores", "regs", "spill B"]
_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def count_sass(sass: str) -> dict:
    """Instruction counts of one disassembled kernel: total (no NOP / self-branch), and the
    global memory opcodes (LDG / STG with their widths) as written."""
    ops = [m.group(2) for m in _INSTRUCTION.finditer(sass)]
    body = [op for op in ops if op != "NOP"]
    # the kernel ends in EXIT; BRA (to itself), plus padding NOPs: not work
    while body and body[-1] == "BRA":
        body.pop()
    loads = sorted({op for op in body if op.startswith("LDG")})
    stores = sorted({op for op in body if op.startswith("STG")})
    return {"instructions": len(body), "loads": loads, "stores": stores,
            "ldg": sum(op.startswith("LDG") for op in body), "stg": sum(op.startswith("STG") for op in body)}


def compile_sass(jit_kernel, launch, target_name: str = "sm90") -> tuple[str, dict | None]:
    """(SASS text, resource usage) of ``launch`` compiled for ``target_name`` into a scratch cache."""
    from tritonwarm.jit.compile import triton_cache_dir
    from tritonwarm.jit.resources import resource_usage, sass
    from tritonwarm.jit.targets import resolve_target, target_driver

    target = resolve_target(target_name)
    if not target.is_nvidia:
        raise ValueError(f"--target {target_name}: SASS needs an NVIDIA target")
    with tempfile.TemporaryDirectory() as cache, target_driver(target) as fake, triton_cache_dir(cache):
        try:
            compiled = jit_kernel.fake_run(launch)
        finally:
            jit_kernel.jit_function.device_caches.pop(fake.device, None)
        cubin = Path(cache) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        return sass(cubin), resource_usage(target, {"k.cubin": str(cubin)})


def fp4_cases(k: int, include_variants: bool):
    """(name, jit kernel, launch, elements per program) for the shipped fp4 quantize kernels at
    [4096, k] bf16, and with ``include_variants`` every variant of bench/fp4_variants.py."""
    import torch
    from tritonwarm.jit import fake_tensor
    from tritonwarm.launchers import fp4 as L

    x = fake_tensor((4096, k), torch.bfloat16)
    gs = fake_tensor((), torch.float32)
    cases = []
    for fmt, block in (("mxfp4", 32), ("nvfp4", 16)):
        packed = fake_tensor((4096, k // 2), torch.uint8)
        scales = fake_tensor((4096, k // block), torch.uint8)
        jit = L.mxfp4_quantize_jit if fmt == "mxfp4" else L.nvfp4_quantize_jit
        launch = (L.mxfp4_quantize_launch(x, packed, scales) if fmt == "mxfp4"
                  else L.nvfp4_quantize_launch(x, gs, packed, scales))
        cases.append((f"{fmt}_quantize shipped", jit, launch, launch.constexprs["GROUPS"] * block))
        if include_variants:
            import fp4_variants as V

            for variant in V.VARIANTS:
                vl = V._launch(fmt, variant, x, gs, packed, scales)
                cases.append((f"{fmt}_quantize {variant.name}", jit, vl, vl.constexprs["GROUPS"] * block))
    return cases


def rows_for(cases, target: str) -> list[list]:
    rows = []
    for name, jit, launch, elements in cases:
        try:
            sass, usage = compile_sass(jit, launch, target)
        except Exception as e:  # noqa: BLE001 - one line, go on
            rows.append([name, f"failed: {one_line(e, 80)}", *["-"] * (len(HEADER) - 2)])
            continue
        c = count_sass(sass)
        usage = usage or {}
        per_thread = elements / (32 * (launch.num_warps or 4))  # every thread runs the whole body
        rows.append([name, c["instructions"], launch.num_warps, f"{per_thread:g}",
                     f"{c['instructions'] / per_thread:.1f}",
                     f"{c['ldg']}x {' '.join(c['loads'])}", f"{c['stg']}x {' '.join(c['stores'])}",
                     usage.get("registers", "-"), usage.get("local", "-")])
    return rows


def main() -> None:
    import triton

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="sm90")
    p.add_argument("--k", type=int, default=7168)
    p.add_argument("--variants", action="store_true", help="also every variant of bench/fp4_variants.py")
    args = p.parse_args()
    from tritonwarm.jit.targets import resolve_target

    try:
        if not resolve_target(args.target).is_nvidia:
            raise ValueError("SASS needs an NVIDIA target")
    except ValueError as e:
        p.error(f"--target {args.target}: {e}")
    rows = rows_for(fp4_cases(args.k, args.variants), args.target)
    command = "python bench/sass_count.py" + (" --variants" if args.variants else "") + f" --target {args.target}"
    table(f"SASS per element, fp4 quantize 4096x{args.k} bf16 ({args.target}, Triton {triton.__version__}, offline)",
          HEADER, rows, command)


if __name__ == "__main__":
    main()
