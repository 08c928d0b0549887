"""The launch specs' shared-memory estimates against what Triton's compiled binaries use, for the
fused MoE GEMM (dense fp32 / bf16 weights, MXFP4, NVFP4; gated and not) and the quantized MLA decode
(fp8_ds_mla, nvfp4_ds_mla) over a grid of tiles, on NVIDIA and AMD targets.

    python bench/shared_estimates.py [--full] [--targets sm80,sm90,sm100,gfx942] [-j N] [--json PATH]

Each row traces one launch for the target (its tile given, not fitted), compiles it (no GPU needed:
Triton compiles for any target here) and reads the binary's shared memory as ``check`` does
(``resources.resource_usage``). The estimate must bound the binary with the allowance
``shared_budget`` keeps free (``estimate + allowance >= compiled``) and should not be far above it
(``ratio`` = estimate / compiled; a large one shrinks tiles for nothing). ``--quick`` (the default)
is a few minutes on two cores; ``--full`` sweeps every block_m, stage count and MLA tile.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(__file__))
from _common import save_json, table  # noqa: E402

TARGETS = "sm80,sm90,sm100,gfx942"
MOE_FORMATS = ("fp32", "bf16", "mxfp4", "nvfp4")
MLA_FORMATS = ("fp8_ds_mla", "nvfp4_ds_mla")
_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclasses.dataclass(frozen=True)
class Case:
    kernel: str  # "moe" or "mla"
    fmt: str  # moe: fp32 / bf16 (dense weights in the activation's dtype), mxfp4, nvfp4; mla: the cache format
    tile: tuple  # moe: (block_m, block_n, block_k, warps, stages, gated); mla: (stages, block_n, block_h, warps)
    act: str = "bf16"  # the activations' (moe: FP4 weights') or q's dtype

    @property
    def label(self) -> str:
        if self.kernel == "moe":
            m, n, k, warps, stages, gated = self.tile
            return f"{m}x{n}x{k} w{warps} s{stages}{' gated' if gated else ''}"
        stages, block_n, block_h, warps = self.tile
        return f"n{block_n} h{block_h} w{warps} s{stages}{' q ' + self.act if self.act != 'bf16' else ''}"


def moe_cases(full: bool) -> list[Case]:
    """Tiles of the shipped tables' shapes: block_m 16/32/64/128, stages 1-4, gated and not."""
    shapes = {16: (64, 64, 4), 32: (128, 64, 4), 64: (128, 64, 8), 128: (128, 64, 8)}  # block_m: (n, k, warps)
    tiles = [(16, 64, 64, 4, 3, True), (64, 128, 64, 8, 3, True), (32, 128, 64, 4, 1, False)]
    if full:
        tiles = [(m, n, k, warps, stages, gated) for m, (n, k, warps) in shapes.items()
                 for stages in (1, 2, 3, 4) for gated in (True, False)]
        tiles += [(16, 64, 256, 4, 3, True), (16, 128, 128, 4, 3, True)]  # the sm90 table's deep-K tiles
    return [Case("moe", fmt, tile, "fp32" if fmt == "fp32" else "bf16") for fmt in MOE_FORMATS for tile in tiles]


def mla_cases(target_name: str, full: bool) -> list[Case]:
    """The tile the tile table (launchers/mla_kv_quant_tiles.json) declares for the target, one with
    an fp32 q (16 tokens, as the launch spec takes), and with ``full`` a sweep around them."""
    from tritonwarm.jit import TARGETS as ALL
    from tritonwarm.launchers.mla_kv_quant import load_quantized_tiles

    target = ALL[target_name]
    table = load_quantized_tiles()
    entry = (table.get(f"{target.backend}:{target.arch}") or table.get(target.backend) or table["default"])
    cases = []
    for fmt in MLA_FORMATS:
        t = entry[fmt]
        tiles = {(t.num_stages, t.block_n, t.block_h, t.num_warps)}
        if full:
            tiles |= {(s, n, h, 8) for s in (1, 2, 3) for n in (16, 32, 64) for h in (16, 64)}
        cases += [Case("mla", fmt, tile) for tile in sorted(tiles)]
    t = entry[MLA_FORMATS[0]]
    cases.append(Case("mla", MLA_FORMATS[0], (t.num_stages, 16, t.block_h, t.num_warps), "fp32"))
    return cases


def _moe_launch(case: Case):
    """(JitKernel, its call's arguments) of one fused MoE GEMM launch with exactly this tile."""
    import torch
    from tritonwarm.jit import fake_tensor
    from tritonwarm.launchers.fused_moe import TileConfig, fused_moe_gemm_jit, fused_moe_nvfp4_gemm_jit

    m, n, k, warps, stages, gated = case.tile
    config = TileConfig(m, n, k, 1, warps, stages)
    act = getattr(torch, _DTYPES[case.act])
    # DeepSeek-V2-Lite's experts (hidden 2048, intermediate 1408: an MXFP4 scale row of 44 bytes, not
    # a multiple of 16, changes how scales load). Gate/up: [2I, H] weights, the activation's dtype
    # out; down: [H, I] weights, fp32 rows per slot out, as ``fused_moe`` launches them.
    experts, hidden, inter, slots = 8, 2048, 1408, 256
    rows, size = (2 * inter, hidden) if gated else (hidden, inter)
    a = fake_tensor((slots, size), act)
    c = fake_tensor((slots, inter), act) if gated else fake_tensor((slots, hidden), torch.float32)
    routing = (fake_tensor((slots,), torch.float32), fake_tensor((slots + experts * m,), torch.int32),
               fake_tensor((slots // m + experts,), torch.int32), fake_tensor((1,), torch.int32))
    flags = (6 if gated else 1, gated, not gated, config)  # gate/up: top-k slots a token; down: one row a slot
    if case.fmt in ("fp32", "bf16"):
        return fused_moe_gemm_jit, (a, fake_tensor((experts, rows, size), act), None, c, *routing, *flags)
    packed = fake_tensor((experts, rows, size // 2), torch.uint8)
    if case.fmt == "mxfp4":
        return fused_moe_gemm_jit, (a, packed, fake_tensor((experts, rows, size // 32), torch.uint8), c, *routing,
                                    *flags)
    return fused_moe_nvfp4_gemm_jit, (a, packed, fake_tensor((experts, rows, size // 16), torch.uint8),
                                      fake_tensor((experts,), torch.float32), c, *routing, *flags)


def _mla_launch(case: Case):
    """(JitKernel, arguments) of one quantized MLA decode split launch (DeepSeek's 512 + 64 geometry,
    128 heads, bf16 q) whose tile is exactly the case's: the launch spec's own launch, re-tiled."""
    import torch
    from tritonwarm.jit import JitKernel, Launch, fake_tensor
    from tritonwarm.launchers import mla_kv_quant
    from tritonwarm.launchers.kv_cache_formats import kv_format

    stages, block_n, block_h, warps = case.tile
    fmt = kv_format(case.fmt)

    def launch(*args):
        real = mla_kv_quant.quantized_mla_decode_split_launch(*args)
        return Launch((real.grid[0], -(-128 // block_h)), real.args,
                      {**real.constexprs, "BLOCK_N": block_n, "BLOCK_H": block_h}, warps, stages, real.options)

    kernel = JitKernel(mla_kv_quant.quantized_mla_decode_split_kernel, launch, name=f"bench.mla.{case.label}",
                       shared_estimate=mla_kv_quant.quantized_mla_decode_split_jit.shared_estimate)
    batch, splits = 4, 8
    q = fake_tensor((batch, 128, 576), getattr(torch, _DTYPES[case.act]))
    cache = fake_tensor((1024, 64, 1, fmt.entry_bytes), torch.uint8)
    return kernel, (q, cache, fake_tensor((batch, 64), torch.int32), fake_tensor((batch,), torch.int32), splits,
                    fake_tensor((batch * splits, 128, 512), torch.float32),
                    fake_tensor((batch * splits, 128), torch.float32), 0.07, case.fmt)


def measure(target_name: str, case: Case) -> dict:
    """Trace, compile and read one case on one target: its estimate and the binary's shared memory."""
    from tritonwarm.jit import TARGETS as ALL
    from tritonwarm.jit import trace_call
    from tritonwarm.jit.cache import entry_files
    from tritonwarm.jit.core.targets import launch_limits
    from tritonwarm.jit.core.tile_fit import shared_budget
    from tritonwarm.jit.pipeline.compile import compile_variant
    from tritonwarm.jit.pipeline.resources import resource_usage

    target = ALL[target_name]
    kernel, args = (_moe_launch if case.kernel == "moe" else _mla_launch)(case)
    (variant,) = [v for v in trace_call(target, kernel, *args)]
    with tempfile.TemporaryDirectory(prefix="shared-estimates-") as cache_dir:
        compile_variant(variant, target, cache_dir)
        usage = resource_usage(target, entry_files(cache_dir, variant.entry_dir, variant.entry_name)) or {}
    allowance = launch_limits(target).shared - shared_budget(target)
    return {"kernel": case.kernel, "format": case.fmt, "tile": case.label, "target": target_name,
            "estimate": variant.shared_estimate, "allowance": allowance, "shared": usage.get("shared")}


def _measure(job):
    try:
        return measure(*job)
    except Exception as e:  # one row's failure is a row, not the end of the table
        target, case = job
        return {"kernel": case.kernel, "format": case.fmt, "tile": case.label, "target": target,
                "error": f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    grid = parser.add_mutually_exclusive_group()
    grid.add_argument("--quick", action="store_true", help="a representative grid (the default)")
    grid.add_argument("--full", action="store_true", help="every block_m, stage count and MLA tile sweep")
    parser.add_argument("--targets", default=TARGETS)
    parser.add_argument("--kernels", default="moe,mla", help="moe, mla or both")
    parser.add_argument("-j", "--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    kernels = args.kernels.split(",")
    jobs = [(t, c) for t in args.targets.split(",")
            for c in (moe_cases(args.full) if "moe" in kernels else []) + (mla_cases(t, args.full) if "mla" in kernels
                                                                            else [])]
    start = time.perf_counter()
    results = []
    with ProcessPoolExecutor(args.jobs) as pool:
        for result in pool.map(_measure, jobs):
            results.append(result)
            print(f"\r{len(results)}/{len(jobs)} compiled", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    rows, unbounded, over_wide, errors = [], 0, 0, 0
    for r in results:
        if "error" in r:
            errors += 1
            rows.append([r["kernel"], r["format"], r["tile"], r["target"], "-", "-", "-", r["error"]])
            continue
        estimate, shared = r["estimate"], r["shared"]
        bounded = estimate + r["allowance"] >= shared
        ratio = estimate / shared if shared else float("inf")
        unbounded += not bounded
        over_wide += bounded and ratio > 1.5 and estimate - shared > r["allowance"]
        rows.append([r["kernel"], r["format"], r["tile"], r["target"], f"{estimate:,}", f"{shared:,}",
                     f"{ratio:.2f}", "ok" if bounded else f"UNDER by {shared - estimate - r['allowance']:,}"])
    table("Shared memory per program: the launch spec's estimate against the compiled binary (bytes; "
          "ratio = estimate / compiled; bound: estimate + allowance >= compiled)",
          ["kernel", "format", "tile", "target", "estimate", "compiled", "ratio", "bound"], rows,
          "python bench/shared_estimates.py " + " ".join(sys.argv[1:]))
    print(f"\n{len(results)} rows in {time.perf_counter() - start:.0f} s: {unbounded} not bounded, "
          f"{over_wide} over 1.5x (beyond the allowance), {errors} failed")
    save_json(args.json, results)


if __name__ == "__main__":
    main()
