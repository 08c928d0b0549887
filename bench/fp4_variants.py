"""MXFP4 / NVFP4 quantize: the integer-rounding kernel as it shipped first against the FP-adder and
the FMA-lines roundings, bf16 pairs read or not, and a sweep of program size and warps, with the
fraction of a device copy's bandwidth measured in the same run (bytes: input read + packed output +
scales). Dequantize is timed once for reference.

    python bench/fp4_variants.py [--json PATH] [--k 7168] [--rows 4096 16]

Every variant's bytes are compared with the shipped-before kernel's (and that one with the PyTorch
reference) before it is timed; a variant that differs is reported WRONG, one that fails prints one
line, and the run goes on. Without a GPU each variant runs once at a tiny size in Triton's
interpreter and is checked the same way; nothing is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import one_line, table  # noqa: E402


@dataclass(frozen=True)
class Variant:
    name: str
    rounding: str  # E2M1 rounding: "integer" (as shipped first), "adder" (FP-adder), "lines" (min of FMA lines)
    elements: int  # elements per program (GROUPS = elements // block)
    warps: int
    why: str
    pairs: bool = False  # bf16: read element pairs as int32 (BF16_PAIRS), no tl.split packing
    formats: tuple[str, ...] = ("mxfp4", "nvfp4")  # "bf16_lines" rounding: MXFP4 only (NVFP4 rounds in fp32)


VARIANTS = [
    Variant("before", "integer", 1024, 4, "integer rounding, 1024 elements / 4 warps: the kernel as it shipped first"),
    Variant("fast-1024x4", "adder", 1024, 4, "FP-adder rounding, the tiling as before"),
    Variant("fast-1024x2", "adder", 1024, 2, "16 elements per thread (timed on the H200): setup paid over 2x the data"),
    Variant("fast-1024x1", "adder", 1024, 1, "32 elements per thread"),
    # (2048 and 4096 elements at 2-8 warps, and 512 at 2, ran in an earlier H200 run of this script;
    # left out to keep a GPU run short, as are pairs at 1 warp and the lines at 2048 / 2 warps, whose
    # SASS is that of the lines at 1024 / 1 warp)
    # bf16, sm90 SASS per element at 1024x2: mxfp4 25.5 -> 22.4, nvfp4 37.1 -> 30.9 (bench/sass_count.py)
    Variant("pairs-1024x2", "adder", 1024, 2, "int32 pair reads", pairs=True),
    # the E2M1 code as the minimum of three FMA lines (_e2m1_lines): mxfp4 22.4 -> 17.9, nvfp4 30.9 -> 28.1
    Variant("lines-1024x2", "lines", 1024, 2, "FMA-lines rounding, int32 pair reads (shipped for bf16)", pairs=True),
    Variant("lines-1024x1", "lines", 1024, 1, "FMA-lines rounding, 32 elements per thread", pairs=True),
    Variant("bf16-1024x2", "bf16_lines", 1024, 2, "FMA lines in bf16 (two elements per HFMA2)", pairs=True,
            formats=("mxfp4",)),
    Variant("bf16-1024x1", "bf16_lines", 1024, 1, "FMA lines in bf16, 32 elements per thread", pairs=True,
            formats=("mxfp4",)),
    Variant("lines-1024x2-elements", "lines", 1024, 2, "FMA-lines rounding, per-element reads (fp16 / fp32's path)"),
]


def _launch(fmt: str, variant: Variant, x, global_scale, packed, scales):
    from tritonwarm.jit import Launch
    from tritonwarm.kernels.fp4 import MXFP4_BLOCK, NVFP4_BLOCK
    from tritonwarm.launchers import fp4 as L
    from tritonwarm.launchers._host import cdiv, next_power_of_2

    block = MXFP4_BLOCK if fmt == "mxfp4" else NVFP4_BLOCK
    n_groups = x.shape[1] // block
    groups = min(max(variant.elements // block, 1), next_power_of_2(n_groups))
    strides = (x.stride(0), packed.stride(0), scales.stride(0))
    args = (x, packed, scales) if fmt == "mxfp4" else (x, global_scale, packed, scales)
    constexprs = dict(GROUPS=groups, E2M1=variant.rounding)
    constexprs["BF16_PAIRS"] = variant.pairs and L._bf16_pairs(x)
    return Launch(grid=(x.shape[0], cdiv(n_groups, groups)), args=args + strides + (n_groups,),
                  constexprs=constexprs, num_warps=variant.warps)


def _quantizer(fmt: str, variant: Variant, x, global_scale):
    """A closure that quantizes ``x`` with ``variant`` into preallocated outputs, and those outputs."""
    from tritonwarm.launchers import fp4 as L

    block = 32 if fmt == "mxfp4" else 16
    packed = torch.empty(x.shape[0], x.shape[1] // 2, dtype=torch.uint8, device=x.device)
    scales = torch.empty(x.shape[0], x.shape[1] // block, dtype=torch.uint8, device=x.device)
    jit = L.mxfp4_quantize_jit if fmt == "mxfp4" else L.nvfp4_quantize_jit
    launch = _launch(fmt, variant, x, global_scale, packed, scales)
    return (lambda: jit.launch(launch)), (packed, scales)


def _reference(fmt, x, global_scale):
    from tritonwarm.kernels import fp4

    if fmt == "mxfp4":
        return fp4.mxfp4_quantize_reference(x)
    packed, scales = fp4.nvfp4_quantize_reference(x, global_scale)
    return packed, scales.view(torch.uint8)


def _inputs(rows: int, k: int, device: str):
    g = torch.Generator(device=device).manual_seed(rows * 7 + k)
    x = torch.randn(rows, k, device=device, generator=g)
    # a different magnitude per 16 elements, so blocks get different scales
    spread = torch.randint(-8, 9, (rows, k // 16, 1), device=device, generator=g).float()
    x = (x.view(rows, k // 16, 16) * torch.pow(2.0, spread)).view(rows, k).to(torch.bfloat16)
    global_scale = (448.0 * 6.0 / x.float().abs().amax()).reshape(()).to(torch.float32)
    return x, global_scale


def _mismatch(fmt, x, global_scale, out, ref) -> str:
    """Where ``out`` and the reference differ, and which of them the reference computed on the CPU
    agrees with (the reference on the device might be the one that is off)."""
    parts = []
    for name, a, b in (("packed", out[0], ref[0]), ("scales", out[1], ref[1])):
        bad = (a != b).nonzero()
        if bad.numel():
            r, c = bad[0].tolist()
            parts.append(f"{bad.shape[0]} {name} bytes differ, first [{r},{c}]: {a[r, c].item():#x} vs ref "
                         f"{b[r, c].item():#x}")
    try:  # the first rows only: the reference is slow on the CPU
        n = 64
        cpu = _reference(fmt, x[:n].cpu(), global_scale.cpu())
        agree = [name for name, o in (("kernel", out), ("device reference", ref))
                 if torch.equal(o[0][:n].cpu(), cpu[0]) and torch.equal(o[1][:n].cpu(), cpu[1])]
        parts.append(f"on the first {n} rows the CPU reference agrees with: {' and '.join(agree) or 'neither'}")
    except Exception as e:  # noqa: BLE001
        parts.append(f"CPU reference failed: {one_line(e)}")
    return "; ".join(parts)


def _time_into(case: dict, fn, nbytes: int, copy_gbs: float) -> None:
    """Median time of ``fn`` and the bandwidth it reaches, absolute and as a share of the copy."""
    from triton.testing import do_bench

    ms = do_bench(fn, return_mode="median")
    case.update(us=ms * 1e3, gbs=nbytes / ms / 1e6, of_copy=nbytes / ms / 1e6 / copy_gbs)


def run(rows_list, k: int, device: str, timed: bool) -> dict:
    from tritonwarm.launchers import fp4 as L

    results: dict = {"device": torch.cuda.get_device_name() if timed else "cpu (interpreter, untimed)",
                     "triton": __import__("triton").__version__, "torch": torch.__version__, "k": k, "cases": []}
    if timed:
        from triton.testing import do_bench

        big = torch.empty(1 << 28, device="cuda", dtype=torch.uint8)
        copy_ms = do_bench(lambda: big.clone(), return_mode="median")
        results["copy_gbs"] = copy_gbs = 2 * big.nbytes / copy_ms / 1e6
        del big
    for rows in rows_list:
        x, global_scale = _inputs(rows, k, device)
        for fmt in ("mxfp4", "nvfp4"):
            block = 32 if fmt == "mxfp4" else 16
            nbytes = x.nbytes + x.numel() // 2 + x.numel() // block
            baseline = None
            try:
                ref = _reference(fmt, x, global_scale)
            except Exception as e:  # noqa: BLE001 - one line, go on
                print(f"{fmt} {rows}x{k}: reference failed: {one_line(e)}")
                ref = None
            for variant in (v for v in VARIANTS if fmt in v.formats):
                case = {"op": f"{fmt}_quantize", "rows": rows, "k": k, "variant": variant.name,
                        "rounding": variant.rounding, "elements": variant.elements, "num_warps": variant.warps,
                        "bytes": nbytes}
                try:
                    fn, out = _quantizer(fmt, variant, x, global_scale)
                    fn()
                    if baseline is None:  # the shipped-before kernel: checked against the reference
                        baseline = out
                        if ref is not None and not (torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])):
                            case["status"] = "WRONG (vs reference)"
                            case["detail"] = _mismatch(fmt, x, global_scale, out, ref)
                            print(f"{fmt} {rows}x{k} {variant.name}: {case['status']}: {case['detail']}")
                    elif not (torch.equal(out[0], baseline[0]) and torch.equal(out[1], baseline[1])):
                        case["status"] = "WRONG"
                    if "status" not in case:
                        case["status"] = "ok"
                        if timed:
                            _time_into(case, fn, nbytes, copy_gbs)
                except Exception as e:  # noqa: BLE001 - one line, go on
                    case["status"] = f"failed: {one_line(e)}"
                    print(f"{fmt} {rows}x{k} {variant.name}: {case['status']}")
                results["cases"].append(case)
            # dequantize as shipped, for reference (its bytes: packed + scales in, bf16 out)
            case = {"op": f"{fmt}_dequantize", "rows": rows, "k": k, "variant": "shipped", "bytes": nbytes}
            try:
                packed, scales = baseline if baseline is not None else _reference(fmt, x, global_scale)
                if fmt == "mxfp4":
                    fn = lambda p=packed, s=scales: L.mxfp4_dequantize(p, s, torch.bfloat16)  # noqa: E731
                else:
                    fn = lambda p=packed, s=scales, gs=global_scale: L.nvfp4_dequantize(  # noqa: E731
                        p, s.view(torch.float8_e4m3fn), gs, torch.bfloat16)
                fn()
                case["status"] = "ok"
                if timed:
                    _time_into(case, fn, nbytes, copy_gbs)
            except Exception as e:  # noqa: BLE001 - one line, go on
                case["status"] = f"failed: {one_line(e)}"
                print(f"{fmt} dequantize {rows}x{k}: {case['status']}")
            results["cases"].append(case)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write every figure here (one JSON object)")
    p.add_argument("--k", type=int, default=7168)
    p.add_argument("--rows", type=int, nargs="+", default=[4096, 16])
    args = p.parse_args()
    timed = torch.cuda.is_available()
    start = time.perf_counter()
    if timed:
        results = run(args.rows, args.k, "cuda", timed=True)
    else:  # tiny sizes through Triton's interpreter: every variant runs and is checked, none timed
        results = run([3, 1], 256, "cpu", timed=False)
    results["wall_s"] = time.perf_counter() - start
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    rows = []
    for c in results["cases"]:
        timing = [f"{c['us']:.1f}", f"{c['gbs']:.0f}", f"{c['of_copy']:.0%}"] if "us" in c else ["-", "-", "-"]
        rows.append([c["op"], f"{c['rows']}x{c['k']}", c["variant"], c["status"][:40], *timing])
    command = "python bench/fp4_variants.py" + (f" --json {args.json}" if args.json else "")
    where = f"{results['device']}, device copy {results['copy_gbs']:.0f} GB/s" if timed else results["device"]
    table(f"fp4 quantize variants, bf16 ({where}; {results['wall_s']:.0f} s)",
          ["op", "shape", "variant", "check", "µs", "GB/s", "of copy"], rows, command)
    if not timed:
        bad = [c for c in results["cases"] if c["status"] != "ok"]
        print(f"\nno GPU here: nothing timed; {len(results['cases']) - len(bad)} of {len(results['cases'])} "
              f"variant runs agree bit for bit in Triton's interpreter.")


if __name__ == "__main__":
    main()
