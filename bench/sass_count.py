"""SASS instructions per element of a kernel, offline: compile for an NVIDIA target under the
target-only driver (no GPU needed), disassemble the cubin with the cuobjdump Triton ships, and
count. A proxy for issue-bound kernels (fp4 quantize): fewer instructions per element, more of the
copy bandwidth. Not a timing: confirm on a GPU.

    python bench/sass_count.py [--target sm90] [--k 7168] [--variants]

Columns: instructions in the whole kernel (NOPs, the trailing BRA-to-self and ptxas's padding under a
never-true predicate excluded; a straight-line kernel has no loop, so this is what every thread
issues), elements per thread, their ratio (instructions a thread issues per element it handles),
widths of global loads / stores (LDG.E.128 = 16 bytes per thread), registers and spill (local) bytes.

    python bench/sass_count.py --attention [--target sm90]

The paged decode attention split kernels as the declared settings of the target compile them
(see below), or with ``--moe`` the fused MoE gate/up GEMM (DeepSeek-V2-Lite experts) per weight
format and tile: the K loop's instructions per weight element (every thread runs the loop, so
instructions over the elements one thread handles per iteration), the global loads of the weight
stream (LDGSTS = cp.async into shared memory, with its width; LDG.E.U8 = byte loads), the integer and
bf16 work of the decode (LOP3, PRMT, shifts, HMUL2), the MMAs (HGMMA: Hopper's warpgroup MMA, HMMA:
mma.sync), registers, spills and shared memory (all pipeline stages) with the programs per SM it allows.

    python bench/sass_count.py --moe [--target sm90]

The paged decode attention split kernels as the declared settings of the target compile them
(DeepSeek-V2-Lite MLA on 64-token pages, Llama-8B GQA on 16-token pages): the token loop's
instructions per iteration (one BLOCK_N tile, per warp), warp-instructions per token of the tile, its
global loads (LDG, and LDGSTS: cp.async into shared memory), MMAs, registers and spills.

    python bench/sass_count.py --mla [--target sm90]

MLA decode's split kernel per KV cache format (bf16 ``auto``, ``fp8_ds_mla``, ``nvfp4_ds_mla``; 16
heads, 512 + 64, 64-token pages, each format's declared tiles): per BLOCK_N tile of the token loop,
the 128-bit loads of the cache (LDG.128 and cp.async LDGSTS.128 warp-instructions, all warps)
against byte loads, the dequantization instructions a thread issues (conversions, packed-half math,
bit operations) per cache byte read, the MMAs (HMMA / HGMMA, all warps), warp-instructions per
token, registers, spills, the raw cache bytes one pipeline stage holds, shared memory and the
programs per SM the two allow.
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
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*)")


def instructions(sass: str) -> list[tuple[int, str, str]]:
    """(address, opcode, operands) of each instruction that can execute: NOPs and ptxas's padding
    under a never-true predicate (``@!UPT UIADD3 URZ, ...``, between dependent MMAs) are left out."""
    return [(int(m.group(1), 16), m.group(3), m.group(4)) for m in _INSTRUCTION.finditer(sass)
            if m.group(3) != "NOP" and (m.group(2) or "").strip() not in ("@!PT", "@!UPT")]


def count_sass(sass: str) -> dict:
    """Instruction counts of one disassembled kernel: total (no NOP, padding or final
    self-branch), and the global memory opcodes (LDG / STG with their widths) as written."""
    body = [op for _, op, _ in instructions(sass)]
    # the kernel ends in EXIT; BRA (to itself), plus padding NOPs: not work
    while body and body[-1] == "BRA":
        body.pop()
    loads = sorted({op for op in body if op.startswith("LDG")})
    stores = sorted({op for op in body if op.startswith("STG")})
    return {"instructions": len(body), "loads": loads, "stores": stores,
            "ldg": sum(op.startswith("LDG") for op in body), "stg": sum(op.startswith("STG") for op in body)}


def compile_sass(jit_kernel, launch, target_name: str = "sm90", with_shared: bool = False):
    """(SASS text, resource usage) of ``launch`` compiled for ``target_name`` into a scratch cache;
    ``with_shared`` adds the launch's shared memory (Triton's metadata: every pipeline stage)."""
    from tritonwarm.jit.cache.triton_dir import triton_cache_dir
    from tritonwarm.jit.core.targets import resolve_target, target_driver
    from tritonwarm.jit.pipeline.resources import resource_usage, sass

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
        text, usage = sass(cubin), resource_usage(target, {"k.cubin": str(cubin)})
        return (text, usage, compiled.metadata.shared) if with_shared else (text, usage)


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

            for variant in (v for v in V.VARIANTS if fmt in v.formats):
                vl = V._launch(fmt, variant, x, gs, packed, scales)
                cases.append((f"{fmt}_quantize {variant.name}", jit, vl, vl.constexprs["GROUPS"] * block))
    return cases


ATTENTION_HEADER = ["kernel", "geometry", "BLOCK_N", "warps", "stages", "loop instr", "warp-instr/token",
                    "loop LDG", "loop LDGSTS", "loop MMA", "regs", "spill B"]


def token_loop(sass: str) -> list[str]:
    """The opcodes of the first innermost loop (a backward branch's body holding no other loop): a
    split kernel's token loop over whole tiles. A partial last tile runs in a second loop after it,
    and the schedule kernel's loop over requests holds both."""
    code = instructions(sass)
    loops = [(int(t.group(1), 16), at) for at, op, rest in code if op == "BRA"
             and (t := re.search(r"0x([0-9a-f]+)", rest)) and int(t.group(1), 16) < at]
    innermost = [(start, end) for start, end in loops
                 if not any(start <= s and e < end for s, e in loops if (s, e) != (start, end))]
    if not innermost:
        return []
    start, end = min(innermost)
    return [op for at, op, _ in code if start <= at <= end]


def attention_rows(target_name: str) -> list[list]:
    """One row per split kernel the declared ``target_name`` settings launch for the two geometries."""
    import torch
    from tritonwarm.jit import fake_tensor, trace_call
    from tritonwarm.jit.core.targets import resolve_target
    from tritonwarm.jit.pipeline.compile import compile_variant
    from tritonwarm.jit.pipeline.resources import resource_usage, sass
    from tritonwarm.launchers import KVCacheLayout, paged_decode_attention

    target = resolve_target(target_name)
    geometries = [("MLA 16 heads, 576/512, 64-token pages", KVCacheLayout.mla(4096, 64, 512, 64), 16, 512),
                  ("GQA 32/8 x 128, 16-token pages", KVCacheLayout.gqa(4096, 16, 8, 128), 32, None)]
    rows = []
    for name, layout, heads, v_dim in geometries:
        batch, bf16 = 64, torch.bfloat16
        args = (fake_tensor((batch, heads, layout.key_dim), bf16), fake_tensor(layout.shape, bf16),
                fake_tensor((batch, 2048), torch.int32), fake_tensor((batch,), torch.int32), 0.08, None, v_dim)
        try:
            split = [v for v in trace_call(target, paged_decode_attention, *args) if "split" in v.kernel]
            with tempfile.TemporaryDirectory() as cache:
                for variant in split:
                    compiled = compile_variant(variant, target, cache)
                    cubin = Path(cache) / "k.cubin"
                    cubin.write_bytes(compiled.asm["cubin"])
                    loop, usage = token_loop(sass(cubin)), resource_usage(target, {"k.cubin": str(cubin)}) or {}
                    block_n, warps = int(variant.args["BLOCK_N"].lstrip("=")), variant.num_warps
                    rows.append([variant.kernel.rsplit(".", 1)[1], name, block_n, warps, variant.num_stages,
                                 len(loop), f"{len(loop) * warps / block_n:.1f}",
                                 sum(op.startswith("LDG") and not op.startswith(("LDGSTS", "LDGDEPBAR"))
                                     for op in loop),
                                 sum(op.startswith("LDGSTS") for op in loop), sum("MMA" in op for op in loop),
                                 usage.get("registers", "-"), usage.get("local", "-")])
        except Exception as e:  # noqa: BLE001 - one line, go on
            rows.append(["-", name, f"failed: {one_line(e, 80)}", *["-"] * (len(ATTENTION_HEADER) - 3)])
    return rows


MOE_HEADER = ["weights", "tile", "loop instr", "instr/weight elem", "weight loads", "LDG.E.U8", "LOP3+shifts",
              "PRMT", "HMUL2", "MMA", "regs", "spill B", "shared KB", "programs/SM"]
MOE_TILES = ("16x64x128 w4 s4", "16x128x128 w4 s3", "32x128x64 w4 s3", "128x128x64 w8 s3")
_EXPERTS, _HIDDEN, _INTER, _TOP_K = 64, 2048, 1408, 6


def _moe_launch(fmt: str, config):
    """(jit kernel, launch) of the gate/up GEMM at DeepSeek-V2-Lite's experts, 64 tokens."""
    import importlib

    import torch
    from tritonwarm.jit import fake_tensor

    FM = importlib.import_module("tritonwarm.launchers.fused_moe")
    slots = 64 * _TOP_K
    blocks = _EXPERTS + slots // config.block_m
    common = (fake_tensor((slots, _INTER), torch.bfloat16), fake_tensor((slots,), torch.float32),
              fake_tensor((blocks * config.block_m,), torch.int32), fake_tensor((blocks,), torch.int32),
              fake_tensor((1,), torch.int32), _TOP_K, True, False, config)
    a = fake_tensor((64, _HIDDEN), torch.bfloat16)
    if fmt == "bf16":
        return FM.fused_moe_gemm_jit, FM.fused_moe_gemm_launch(
            a, fake_tensor((_EXPERTS, 2 * _INTER, _HIDDEN), torch.bfloat16), None, *common)
    packed = fake_tensor((_EXPERTS, 2 * _INTER, _HIDDEN // 2), torch.uint8)
    if fmt == "mxfp4":
        return FM.fused_moe_gemm_jit, FM.fused_moe_gemm_launch(
            a, packed, fake_tensor((_EXPERTS, 2 * _INTER, _HIDDEN // 32), torch.uint8), *common)
    return FM.fused_moe_nvfp4_gemm_jit, FM.fused_moe_nvfp4_gemm_launch(
        a, packed, fake_tensor((_EXPERTS, 2 * _INTER, _HIDDEN // 16), torch.uint8),
        fake_tensor((_EXPERTS,), torch.float32), *common)


def _tile(name: str):
    import importlib

    m, n, k = (int(x) for x in name.split()[0].split("x"))
    warps, stages = int(name.split()[1][1:]), int(name.split()[2][1:])
    return importlib.import_module("tritonwarm.launchers.fused_moe").TileConfig(m, n, k, 1, warps, stages)


def moe_rows(target_name: str, tiles=MOE_TILES, formats=("bf16", "mxfp4", "nvfp4")) -> list[list]:
    """One row per (weight format, tile): the gate/up GEMM's K loop, compiled for ``target_name``."""
    from tritonwarm.jit.core.targets import resolve_target, target_driver

    target = resolve_target(target_name)
    limit = {"sm80": 166912, "sm90": 232448, "sm100": 232448, "sm120": 101376}.get(target_name)
    rows = []
    for fmt in formats:
        for name in tiles:
            config = _tile(name)
            try:
                with target_driver(target):  # the launcher reads the target (BF16_BITS)
                    jit, launch = _moe_launch(fmt, config)
                text, usage, shared = compile_sass(jit, launch, target_name, with_shared=True)
            except Exception as e:  # noqa: BLE001 - one line, go on
                rows.append([fmt, name, f"failed: {one_line(e, 80)}", *["-"] * (len(MOE_HEADER) - 3)])
                continue
            loop = token_loop(text)
            usage = usage or {}
            # both weight tiles (gate and up) per iteration, shared by every thread of the program
            per_thread = 2 * config.block_n * config.block_k / (32 * config.num_warps)
            loads = sorted({op for op in loop if op.startswith(("LDG", "LDGSTS")) and op != "LDGDEPBAR"})
            programs = (limit // shared) if limit and shared else "-"
            mmas = sorted({op for op in loop if "MMA" in op})
            rows.append([fmt, name, len(loop), f"{len(loop) / per_thread:.2f}",
                         " ".join(f"{sum(o == op for o in loop)}x {op}" for op in loads),
                         sum(op == "LDG.E.U8" for op in loop),
                         sum(op.startswith(("LOP3", "SHF", "IMAD.SHL")) for op in loop),
                         sum(op.startswith("PRMT") for op in loop), sum(op.startswith("HMUL2") for op in loop),
                         " ".join(f"{sum(o == op for o in loop)}x {op}" for op in mmas),
                         usage.get("registers", "-"), usage.get("local", "-"), f"{shared / 1024:.0f}", programs])
    return rows


MLA_HEADER = ["format", "BLOCK_N", "warps", "stages", "loop instr", "warp-instr/token", "128-bit loads/tile",
              "byte loads/tile", "dequant instr/byte", "MMA/tile", "regs", "spill B", "stage KB", "shared KB",
              "CTAs/SM"]
# Opcodes that turn stored codes into MMA operands: conversions, packed half math, bit operations.
DEQUANT_OPCODES = ("F2FP", "F2F.", "HADD2", "HMUL2", "HFMA2", "LOP3", "SHF", "IMAD.SHL", "PRMT", "I2F", "SGXT")
SM_LIMITS = {"shared": 233472, "registers": 65536, "threads": 2048}  # per SM, sm90 (H100 / H200)


def _mla_format_calls(batch: int = 64):
    """(format, bytes read per token, launcher, args) for the three MLA caches at DeepSeek-V2-Lite geometry."""
    import torch
    from tritonwarm.jit import fake_tensor
    from tritonwarm.launchers import KVCacheLayout, kv_format, paged_decode_attention, quantized_mla_decode_attention

    q, table_, lens = (fake_tensor((batch, 16, 576), torch.bfloat16), fake_tensor((batch, 2048), torch.int32),
                       fake_tensor((batch,), torch.int32))
    layout = KVCacheLayout.mla(4096, 64, 512, 64)
    calls = [("auto", 1152, paged_decode_attention, (q, fake_tensor(layout.shape, torch.bfloat16), table_, lens, 0.08,
                                                      None, 512))]
    for name in ("fp8_ds_mla", "nvfp4_ds_mla"):
        fmt = kv_format(name)
        cache = fake_tensor((4096, 64, 1, fmt.entry_bytes), torch.uint8)
        calls.append((name, fmt.payload_bytes, quantized_mla_decode_attention,
                      (q, cache, table_, lens, 0.08, name, 512)))
    return calls


def mla_row(name: str, token_bytes: int, sass_text: str, usage: dict, block_n: int, warps: int, stages: int) -> list:
    """One table row from a compiled split kernel's SASS and resource usage."""
    loop = token_loop(sass_text)
    wide = sum(op.startswith(("LDG.E.128", "LDGSTS.E.128", "LDGSTS.E.BYPASS.128")) for op in loop) * warps
    narrow = sum(op.startswith(("LDG", "LDS")) and op.split(".")[-1] in ("U8", "S8") for op in loop) * warps
    dequant = sum(op.startswith(DEQUANT_OPCODES) for op in loop) * warps
    mma = sum("MMA" in op for op in loop) * warps
    regs, shared = usage.get("registers"), usage.get("shared")
    fits = [SM_LIMITS["threads"] // (32 * warps)]
    if shared:
        fits.append(SM_LIMITS["shared"] // shared)
    if regs:
        fits.append(SM_LIMITS["registers"] // (regs * 32 * warps))
    return [name, block_n, warps, stages, len(loop), f"{len(loop) * warps / block_n:.1f}", wide, narrow,
            f"{32 * dequant / (block_n * token_bytes):.2f}", mma, regs if regs is not None else "-",
            usage.get("local", "-"),
            f"{block_n * token_bytes / 1024:.1f}", f"{shared / 1024:.1f}" if shared else "-", min(fits)]


def mla_rows(target_name: str) -> list[list]:
    """One row per MLA cache format: the split kernel its declared settings launch on ``target_name``."""
    from tritonwarm.jit import trace_call
    from tritonwarm.jit.core.targets import resolve_target
    from tritonwarm.jit.pipeline.compile import compile_variant
    from tritonwarm.jit.pipeline.resources import resource_usage, sass

    target = resolve_target(target_name)
    rows = []
    for name, token_bytes, launcher, args in _mla_format_calls():
        try:
            [variant] = [v for v in trace_call(target, launcher, *args) if "split" in v.kernel]
            with tempfile.TemporaryDirectory() as cache:
                compiled = compile_variant(variant, target, cache)
                cubin = Path(cache) / "k.cubin"
                cubin.write_bytes(compiled.asm["cubin"])
                usage = resource_usage(target, {"k.cubin": str(cubin)}) or {}
                usage["shared"] = compiled.metadata.shared or usage.get("shared")
                rows.append(mla_row(name, token_bytes, sass(cubin), usage, int(variant.args["BLOCK_N"].lstrip("=")),
                                    variant.num_warps, variant.num_stages))
        except Exception as e:  # noqa: BLE001 - one line, go on
            rows.append([name, f"failed: {one_line(e, 80)}", *["-"] * (len(MLA_HEADER) - 2)])
    return rows


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
    p.add_argument("--attention", action="store_true",
                   help="the paged decode attention split kernels' token loop instead of fp4 quantize")
    p.add_argument("--moe", action="store_true", help="the fused MoE GEMM's K loop per weight format and tile")
    p.add_argument("--mla", action="store_true",
                   help="MLA decode's token loop per KV cache format (bf16, fp8_ds_mla, nvfp4_ds_mla)")
    args = p.parse_args()
    from tritonwarm.jit.core.targets import resolve_target

    try:
        if not resolve_target(args.target).is_nvidia:
            raise ValueError("SASS needs an NVIDIA target")
    except ValueError as e:
        p.error(f"--target {args.target}: {e}")
    if args.moe:
        table(f"SASS of the fused MoE gate/up K loop ({args.target}, Triton {triton.__version__}, 64 experts, "
              "2048/1408, offline)", MOE_HEADER, moe_rows(args.target),
              f"python bench/sass_count.py --moe --target {args.target}")
        return
    if args.mla:
        table(f"SASS of MLA decode's token loop per KV cache format ({args.target}, Triton {triton.__version__}, "
              "declared settings, offline; per BLOCK_N tile, all warps)", MLA_HEADER, mla_rows(args.target),
              f"python bench/sass_count.py --mla --target {args.target}")
        return
    if args.attention:
        table(f"SASS of the paged decode attention token loop ({args.target}, Triton {triton.__version__}, "
              "declared settings, offline)", ATTENTION_HEADER, attention_rows(args.target),
              f"python bench/sass_count.py --attention --target {args.target}")
        return
    rows = rows_for(fp4_cases(args.k, args.variants), args.target)
    command = "python bench/sass_count.py" + (" --variants" if args.variants else "") + f" --target {args.target}"
    table(f"SASS per element, fp4 quantize 4096x{args.k} bf16 ({args.target}, Triton {triton.__version__}, offline)",
          HEADER, rows, command)


if __name__ == "__main__":
    main()
