"""What one program of a compiled entry occupies (registers, spills, shared memory, threads), read
offline, and how it compares with its target's launch limits (``targets.LIMITS``).

NVIDIA: the cubin through the ``cuobjdump`` Triton's wheel ships (SASS with the same tool); AMD: the
kernel descriptor in the hsaco's note (VGPRs, AGPRs, SGPRs, LDS, scratch); both: Triton's own
metadata (the dynamic shared memory its launcher asks for, the warps). No GPU and no CUDA toolkit
needed. Triton compiles a variant whatever it needs; the GPU refuses one over a limit when it is
loaded (``OutOfResources``: "out of resource: shared memory, Required: 294912, Hardware limit:
232448"), which is what ``over_limits`` says before a server finds out.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..core.targets import Target, launch_limits
from .hsaco import amd_kernel_descriptor

_USAGE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")
NVIDIA_REGISTER_UNIT = 8  # registers are allocated per warp in units of 256: 8 per thread
AMD_SIMDS = 4  # SIMDs per CU: the waves of a workgroup share their VGPR files
AMD_VGPR_UNIT = 8  # VGPR allocation granularity per lane (CDNA2-4, wave64)


@lru_cache(maxsize=1)
def cuobjdump() -> Path | None:
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return path if path.exists() else None


def _metadata(files: dict[str, str]) -> dict:
    path = next((p for name, p in files.items() if name.endswith(".json") and not name.startswith("__grp__")), None)
    try:
        data = json.loads(Path(path).read_text()) if path else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def resource_usage(target, files: dict[str, str]) -> dict | None:
    """What one program of an entry occupies: ``shared`` bytes, ``num_warps`` and, where the binary
    tells, ``registers`` per thread and spill bytes (``local``); NVIDIA also ``stack``, AMD ``agprs``
    and ``sgprs`` (``registers`` is then the VGPRs + AGPRs a lane holds); Blackwell
    ``tensor_memory`` (columns).

    ``shared`` is Triton's launch-time shared memory (the ``shared`` of the entry's metadata, which
    its launcher passes as dynamic shared memory: pipeline stages, layout conversions) plus the
    binary's static part, which is all the binary shows: 1 KB for an sm90 kernel whose pipeline
    stages take 160 KB. The GPU holds the sum to the target's limit."""
    usage: dict = {}
    metadata = _metadata(files)
    dynamic = metadata.get("shared")
    dynamic = dynamic if isinstance(dynamic, int) and not isinstance(dynamic, bool) else None
    static = 0
    cubin = next((p for name, p in files.items() if name.endswith(".cubin")), None)
    hsaco = next((p for name, p in files.items() if name.endswith(".hsaco")), None)
    if cubin is not None and (tool := cuobjdump()) is not None:
        try:
            out = subprocess.run([str(tool), "--dump-resource-usage", cubin], capture_output=True, text=True,
                                 timeout=60, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        match = _USAGE.search(out)
        if match:
            registers, stack, static, local = map(int, match.groups())
            # Local memory in a Triton kernel is register spill space (Triton allocates no local arrays).
            usage.update(registers=registers, stack=stack, local=local)
    elif hsaco is not None:
        kernel = amd_kernel_descriptor(hsaco)
        if kernel:
            usage.update(_amd_usage(kernel))
            static = int(kernel.get(".group_segment_fixed_size") or 0)
    if "registers" in usage:
        usage["static_shared"] = static
    if dynamic is not None:
        usage["shared"] = dynamic + static
    elif "registers" in usage:
        usage["shared"] = static
    for name, key in (("num_warps", "num_warps"), ("tensor_memory", "tmem_size")):
        value = metadata.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and (value or name == "num_warps"):
            usage[name] = value
    return usage or None


def sass(cubin: Path) -> str:
    tool = cuobjdump()
    if tool is None:
        raise LookupError("cuobjdump is not shipped with this Triton: no SASS")
    done = subprocess.run([str(tool), "--dump-sass", str(cubin)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise LookupError(f"{cubin}: cuobjdump cannot read it ({why}): a damaged entry; "
                          "`tritonwarm check` finds it, `tritonwarm warmup` rebuilds it")
    return done.stdout


def _amd_usage(kernel: dict) -> dict:
    def count(key):
        value = kernel.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    # CDNA2 and later (every AMD target here): one register file per lane, and LLVM's ``.vgpr_count``
    # is already its whole use: the VGPRs, rounded up to 4, plus the AGPRs (``.agpr_count`` alone)
    return {"registers": count(".vgpr_count"), "agprs": count(".agpr_count"), "sgprs": count(".sgpr_count"),
            "local": count(".private_segment_fixed_size")}


# --------------------------------------------------------------------------- against the target's limits


@dataclass(frozen=True)
class Excess:
    """One limit a variant is over: what it needs against what the target allows."""

    resource: str  # "shared memory", "registers per thread", "register file", "threads", "SGPRs", ...
    need: int
    limit: int
    unit: str

    def line(self) -> str:
        return f"{self.resource} {self.need:,} {self.unit} > {self.limit:,}"

    def to_json(self) -> dict:
        return dict(self.__dict__)


def over_limits(target: Target, usage: dict | None, num_warps: int | None = None) -> list[Excess]:
    """Every launch limit of ``target`` (``targets.LIMITS``) that a variant using ``usage``
    (``resource_usage``'s dict) and ``num_warps`` is over; [] when it fits or nothing is known."""
    if usage is None:
        return []
    limits = launch_limits(target)
    warps = usage.get("num_warps", num_warps) or 0
    threads = warps * target.warp_size
    out = []
    shared = usage.get("shared")
    if isinstance(shared, int) and shared > limits.shared:
        out.append(Excess("shared memory" if target.is_nvidia else "LDS", shared, limits.shared, "bytes per block"))
    if threads > limits.threads:
        out.append(Excess("threads", threads, limits.threads, "per block"))
    registers = usage.get("registers")
    if isinstance(registers, int) and registers:
        if registers > limits.registers_per_thread:
            out.append(Excess("registers" if target.is_nvidia else "VGPRs + AGPRs", registers,
                              limits.registers_per_thread, "per thread"))
        held = _register_file_use(target, registers, warps)
        file_limit = limits.register_file if target.is_nvidia else limits.register_file // AMD_SIMDS
        if held > file_limit:
            where = "per block" if target.is_nvidia else "per SIMD (the waves of a workgroup share 4)"
            out.append(Excess("register file", held, file_limit, f"registers {where}"))
    sgprs = usage.get("sgprs")
    if limits.scalar_registers is not None and isinstance(sgprs, int) and sgprs > limits.scalar_registers:
        out.append(Excess("SGPRs", sgprs, limits.scalar_registers, "per wave"))
    tmem = usage.get("tensor_memory")
    if isinstance(tmem, int) and tmem and tmem > (limits.tensor_memory or 0):
        out.append(Excess("tensor memory", tmem, limits.tensor_memory or 0, "columns"))
    return out


def entry_usage(target: Target, files: dict[str, str], recorded: dict | None) -> dict | None:
    """``resource_usage`` of a cache entry whose files match its manifest record: Triton's metadata
    read now (the shared memory and warps its loader checks), the binary's own part (registers, static
    shared memory) as the warm-up that recorded those same files read it; read from the binary only
    where the record has none (an entry recorded before it was measured)."""
    known = (recorded or {}).get("resources")
    if not isinstance(known, dict) or "static_shared" not in known:
        return resource_usage(target, files)
    usage = {k: v for k, v in known.items() if k not in ("shared", "num_warps", "tensor_memory")}
    metadata = _metadata(files)
    dynamic = metadata.get("shared")
    if isinstance(dynamic, int) and not isinstance(dynamic, bool):
        usage["shared"] = dynamic + (known["static_shared"] or 0)
    for name, key in (("num_warps", "num_warps"), ("tensor_memory", "tmem_size")):
        value = metadata.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and (value or name == "num_warps"):
            usage[name] = value
    return usage


def what_sets_it(args: dict[str, str], num_warps: int | None, num_stages: int | None) -> str:
    """The constexprs, options and operand types a variant was compiled with (its traced ``args``):
    what sizes its tiles."""
    constexprs = [f"{name}{cls}" for name, cls in args.items() if cls.startswith("=") and cls != "=None"]
    operands = sorted({cls.split()[0] for cls in args.values() if cls.startswith("*")})
    return " ".join(constexprs + [f"num_warps={num_warps}", f"num_stages={num_stages}"] +
                    ([f"operands {','.join(operands)}"] if operands else []))


def over_limit_row(variant: dict, excess: list[Excess]) -> dict:
    """A variant (``Variant.to_json()`` or a check's summary of it) over its target's limits, as
    reports keep it."""
    return {"id": variant["id"], "kernel": variant["kernel"], "rows": list(variant.get("rows", [])),
            "needs": [e.to_json() for e in excess],
            "set_by": what_sets_it(variant.get("args", {}), variant.get("num_warps"), variant.get("num_stages")),
            "shared_estimate": variant.get("shared_estimate")}


def over_limit_line(target: str, row: dict) -> str:
    """One line for a variant over its target's launch limits: the kernel, the spec row or engine step
    it comes from, what it needs against the limit, and the constexprs and options that set it."""
    needs = "; ".join(Excess(**n).line() for n in row["needs"])
    rows = row["rows"]
    where = (f" ({rows[0]}" + (f", and {len(rows) - 1} more rows" if len(rows) > 1 else "") + ")") if rows else ""
    kernel = row["kernel"].rsplit(".", 1)[-1]
    return (f"{kernel} {row['id']}{where}: over {target}'s launch limits, the GPU refuses to load it: {needs}; "
            f"set by {row['set_by']}")


def pruned_line(target: str, rows: list[dict]) -> str:
    """One line for the autotune configs over the target's limits: Triton's autotuner catches the
    GPU's refusal (``OutOfResources``) while it benchmarks and skips them, so they are no error."""
    kernels: dict[str, int] = {}
    for row in rows:
        name = row["kernel"].rsplit(".", 1)[-1]
        kernels[name] = kernels.get(name, 0) + 1
    named = ", ".join(f"{name} {count}" for name, count in sorted(kernels.items()))
    return (f"{len(rows)} autotune config{'s' if len(rows) != 1 else ''} over {target}'s launch limits ({named}): "
            "pruned, Triton's autotuner skips them at run time")


def _register_file_use(target: Target, registers: int, warps: int) -> int:
    """Registers a block holds as the hardware allocates them: NVIDIA per warp in units of 256; AMD
    per wave in units of 8 per lane, the waves spread over the CU's 4 SIMDs (counted for the fullest)."""
    if target.is_nvidia:
        return -(-registers // NVIDIA_REGISTER_UNIT) * NVIDIA_REGISTER_UNIT * target.warp_size * warps
    waves_per_simd = -(-warps // AMD_SIMDS)
    return -(-registers // AMD_VGPR_UNIT) * AMD_VGPR_UNIT * target.warp_size * waves_per_simd
