"""Compile targets, and the target-only driver that lets Triton compile for a GPU this machine lacks.

Triton asks its *active driver* for the target, device and stream before it compiles. A machine
with no GPU has no driver, so ``JITFunction.warmup`` fails with "0 active drivers". Installing an
object that only answers those three questions is enough for Triton's real binder, key and compiler
to run. ``target_driver`` is the one place that installs it, and it restores the previous driver on
every exit path (``driver.reset_active()`` itself fails on a GPU-less machine).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from dataclasses import dataclass
from types import SimpleNamespace

from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver


class UnknownTargetError(ValueError):
    pass


@dataclass(frozen=True)
class Target:
    name: str
    backend: str  # "cuda" or "hip"
    arch: int | str
    warp_size: int

    @property
    def gpu_target(self) -> GPUTarget:
        return GPUTarget(self.backend, self.arch, self.warp_size)

    @property
    def is_nvidia(self) -> bool:
        return self.backend == "cuda"

    @property
    def binary_ext(self) -> str:
        return "cubin" if self.is_nvidia else "hsaco"

    @property
    def family(self) -> str:
        """The GPU generation (``hopper``, ``blackwell``, ``cdna3``, ...): what per-generation defaults
        are keyed by; a target of no known generation is its backend's name (``cuda``, ``hip``)."""
        known = FAMILIES.get(self.name)
        if known is not None:
            return known
        if self.is_nvidia:
            return _CUDA_MAJOR_FAMILIES.get(int(self.arch) // 10, "cuda")
        return next((f for prefix, f in _HIP_PREFIX_FAMILIES if str(self.arch).startswith(prefix)), "hip")


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("sm80", "cuda", 80, 32),
        Target("sm86", "cuda", 86, 32),
        Target("sm89", "cuda", 89, 32),
        Target("sm90", "cuda", 90, 32),
        Target("sm100", "cuda", 100, 32),
        Target("sm103", "cuda", 103, 32),
        Target("sm120", "cuda", 120, 32),
        Target("sm121", "cuda", 121, 32),
        Target("gfx90a", "hip", "gfx90a", 64),
        Target("gfx942", "hip", "gfx942", 64),
        Target("gfx950", "hip", "gfx950", 64),
    )
}


# The generation of each target in the table; other archs by their major version (sm87 ampere, sm103
# blackwell) or their gfx prefix.
FAMILIES: dict[str, str] = {
    "sm80": "ampere", "sm86": "ampere", "sm89": "ada", "sm90": "hopper", "sm100": "blackwell", "sm103": "blackwell",
    "sm120": "blackwell-rtx", "sm121": "blackwell-rtx", "gfx90a": "cdna2", "gfx942": "cdna3", "gfx950": "cdna4",
}
_CUDA_MAJOR_FAMILIES = {8: "ampere", 9: "hopper", 10: "blackwell", 11: "blackwell", 12: "blackwell-rtx"}
_HIP_PREFIX_FAMILIES = (("gfx90a", "cdna2"), ("gfx94", "cdna3"), ("gfx95", "cdna4"))


def target_from_gpu_target(gpu: GPUTarget) -> Target:
    if gpu.backend == "cuda":
        name = f"sm{gpu.arch}"
    else:
        name = str(gpu.arch).split(":")[0]
    known = TARGETS.get(name)
    return known if known is not None else Target(name, gpu.backend, gpu.arch, gpu.warp_size)


def local_target() -> Target | None:
    """The target of the GPU in this machine, or None when there is none."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        return target_from_gpu_target(driver.active.get_current_target())
    except Exception:
        return None


_active_target: tuple[object, GPUTarget] | None = None  # (the driver asked, its answer)


def active_gpu_target() -> GPUTarget | None:
    """The target Triton's active driver compiles for: the GPU's, or warm-up's target-only driver's;
    None on a host with neither (Triton's interpreter). Launch specs that read per-target data call
    this on every launch, so the answer is cached per driver object: one identity check, and each
    warm-up target's driver (a new object) is asked afresh."""
    global _active_target
    from triton.runtime import driver

    try:
        active = driver.active
    except Exception:  # no GPU driver on this machine
        return None
    cached = _active_target
    if cached is not None and cached[0] is active:
        return cached[1]
    try:
        target = active.get_current_target()
    except Exception:  # a driver without a device to ask
        return None
    _active_target = (active, target)
    return target


def resolve_target(name: str | None) -> Target:
    """``sm90`` / ``gfx942`` / ... / ``local``, or a GPU name (``h100``, ``mi300x``: see ``gpu_names``);
    None means the local GPU. Errors name the nearest known name and list the choices."""
    if name in (None, "local"):
        target = local_target()
        if target is None:
            raise UnknownTargetError(
                f"no GPU on this machine: pass --target, one of {', '.join(TARGETS)}"
            )
        return target
    from .gpu_names import nearest, target_of_gpu

    target = TARGETS.get(name) or TARGETS.get(target_of_gpu(name) or "")
    if target is None:
        near = nearest(name, TARGETS)
        raise UnknownTargetError(f"unknown target {name!r}" + (f" (nearest: {near})" if near else "") +
                                 f": choose one of {', '.join(TARGETS)}, local, or a GPU name (`tritonwarm targets`)")
    return target


def resolve_targets(names: str | None) -> list[Target]:
    """A comma-separated list of targets (``sm90,gfx942``), deduplicated in order."""
    parts = [None] if names is None else [p.strip() for p in names.split(",") if p.strip()]
    seen: dict[str, Target] = {}
    for part in parts or [None]:
        target = resolve_target(part)
        seen.setdefault(target.name, target)
    return list(seen.values())


@dataclass(frozen=True)
class DeviceProperties:
    """What launchers ask a device (SM count, shared memory, ...), for a representative GPU of a target.

    Host code that sizes grids or picks a block from the device (``torch.cuda.get_device_properties``,
    Triton's ``driver.active.utils.get_device_properties``) must see the target's answers while it is
    traced on a build machine, never the build machine's own GPU (or its lack of one).
    """

    name: str
    major: int
    minor: int
    multi_processor_count: int
    max_shared_mem: int  # bytes per block, opt-in maximum
    total_memory: int
    regs_per_multiprocessor: int = 65536
    max_threads_per_multi_processor: int = 2048
    L2_cache_size: int = 50 * 2**20
    sm_clock_rate: int = 1_980_000  # kHz
    mem_clock_rate: int = 2_619_000  # kHz
    mem_bus_width: int = 5120
    gcnArchName: str = ""

    def triton_dict(self, warp_size: int) -> dict:
        """The dict Triton's own ``utils.get_device_properties`` returns."""
        props = {"max_shared_mem": self.max_shared_mem, "max_num_regs": self.regs_per_multiprocessor,
                 "multiprocessor_count": self.multi_processor_count, "warpSize": warp_size,
                 "sm_clock_rate": self.sm_clock_rate, "mem_clock_rate": self.mem_clock_rate,
                 "mem_bus_width": self.mem_bus_width}
        if self.gcnArchName:
            props.update(arch=self.gcnArchName, max_threads_per_sm=self.max_threads_per_multi_processor,
                         cooperativeLaunch=1)
        return props

    def torch_properties(self, warp_size: int) -> SimpleNamespace:
        """Stands in for ``torch.cuda.get_device_properties(...)``: the same attribute names."""
        return SimpleNamespace(**self.__dict__, warp_size=warp_size, is_integrated=False, is_multi_gpu_board=False,
                               shared_memory_per_block_optin=self.max_shared_mem,
                               shared_memory_per_multiprocessor=self.max_shared_mem,
                               shared_memory_per_block=min(self.max_shared_mem, 49152))


_GiB = 2**30
# One representative GPU per target (the one a serving fleet most often has).
DEVICES: dict[str, DeviceProperties] = {
    "sm80": DeviceProperties("NVIDIA A100-SXM4-80GB", 8, 0, 108, 166912, 80 * _GiB, L2_cache_size=40 * 2**20),
    "sm86": DeviceProperties("NVIDIA GeForce RTX 3090", 8, 6, 82, 101376, 24 * _GiB,
                             max_threads_per_multi_processor=1536, L2_cache_size=6 * 2**20, mem_bus_width=384),
    "sm89": DeviceProperties("NVIDIA L40S", 8, 9, 142, 101376, 48 * _GiB, max_threads_per_multi_processor=1536,
                             L2_cache_size=96 * 2**20, mem_bus_width=384),
    "sm90": DeviceProperties("NVIDIA H100 80GB HBM3", 9, 0, 132, 232448, 80 * _GiB),
    "sm100": DeviceProperties("NVIDIA B200", 10, 0, 148, 232448, 180 * _GiB, L2_cache_size=126 * 2**20,
                              mem_bus_width=8192),
    "sm103": DeviceProperties("NVIDIA B300 SXM6 AC", 10, 3, 148, 232448, 288 * _GiB, L2_cache_size=126 * 2**20,
                              mem_bus_width=8192),
    "sm120": DeviceProperties("NVIDIA GeForce RTX 5090", 12, 0, 170, 101376, 32 * _GiB,
                              max_threads_per_multi_processor=1536, L2_cache_size=96 * 2**20, mem_bus_width=512),
    "sm121": DeviceProperties("NVIDIA GB10", 12, 1, 48, 101376, 128 * _GiB, max_threads_per_multi_processor=1536,
                              L2_cache_size=24 * 2**20, mem_bus_width=256),
    "gfx90a": DeviceProperties("AMD Instinct MI250X", 9, 0, 110, 65536, 64 * _GiB, L2_cache_size=8 * 2**20,
                               mem_bus_width=4096, gcnArchName="gfx90a:sramecc+:xnack-"),
    "gfx942": DeviceProperties("AMD Instinct MI300X", 9, 4, 304, 65536, 192 * _GiB, L2_cache_size=4 * 2**20,
                               mem_bus_width=8192, gcnArchName="gfx942:sramecc+:xnack-"),
    "gfx950": DeviceProperties("AMD Instinct MI355X", 9, 5, 256, 163840, 288 * _GiB, L2_cache_size=4 * 2**20,
                               mem_bus_width=8192, gcnArchName="gfx950:sramecc+:xnack-"),
}


def device_properties(target: Target) -> DeviceProperties:
    known = DEVICES.get(target.name)
    if known is not None:
        return known
    if target.is_nvidia:
        major, minor = divmod(int(target.arch), 10)
        return DeviceProperties(f"sm{target.arch}", major, minor, 132, launch_limits(target).shared, 80 * _GiB)
    return DeviceProperties(str(target.arch), 9, 4, 304, launch_limits(target).shared, 192 * _GiB,
                            gcnArchName=str(target.arch))


@dataclass(frozen=True)
class LaunchLimits:
    """What one program of a kernel (a thread block; on AMD a workgroup) may hold on a target.

    Triton compiles a variant over any of these, and the GPU refuses it when it is loaded
    (``OutOfResources``) or launched; ``jit.pipeline.resources.over_limits`` compares a compiled variant with them.
    """

    shared: int  # bytes of shared memory (AMD: LDS) per block, the opt-in maximum, static + dynamic
    registers_per_thread: int  # NVIDIA: registers per thread; AMD: VGPRs + AGPRs per lane
    register_file: int  # 32-bit registers the threads of one block may hold together (AMD: one CU's VGPRs)
    threads: int = 1024  # threads (work-items) per block
    scalar_registers: int | None = None  # AMD: SGPRs per wave, VCC, FLAT_SCRATCH and XNACK_MASK included
    tensor_memory: int | None = None  # Blackwell (sm100): tensor memory columns per block
    source: str = ""


_CUDA_GUIDE = "CUDA C++ Programming Guide, Technical Specifications per Compute Capability"
_ROCM = ("ROCm GPU hardware specifications (LDS per workgroup, VGPR file of 512 KiB per CU); LLVM AMDGPUUsage "
         "(512 VGPRs + AGPRs per lane, 102 SGPRs + 6 special per wave on GFX9)")
# One row per target; a target with no row gets its compute capability's (``launch_limits``).
LIMITS: dict[str, LaunchLimits] = {
    "sm80": LaunchLimits(166912, 255, 65536, source=f"{_CUDA_GUIDE}: 8.0, 163 KB"),
    "sm86": LaunchLimits(101376, 255, 65536, source=f"{_CUDA_GUIDE}: 8.6, 99 KB"),
    "sm89": LaunchLimits(101376, 255, 65536, source=f"{_CUDA_GUIDE}: 8.9, 99 KB"),
    "sm90": LaunchLimits(232448, 255, 65536, source=f"{_CUDA_GUIDE}: 9.0, 227 KB"),
    "sm100": LaunchLimits(232448, 255, 65536, tensor_memory=512,
                          source=f"{_CUDA_GUIDE}: 10.0, 227 KB; 512 TMEM columns (Triton's own load check)"),
    "sm103": LaunchLimits(232448, 255, 65536, tensor_memory=512,
                          source=f"{_CUDA_GUIDE}: 10.3, 227 KB; 512 TMEM columns (Triton's own load check)"),
    "sm120": LaunchLimits(101376, 255, 65536, source=f"{_CUDA_GUIDE}: 12.0, 99 KB"),
    "sm121": LaunchLimits(101376, 255, 65536, source=f"{_CUDA_GUIDE}: 12.1, 99 KB"),
    "gfx90a": LaunchLimits(65536, 512, 131072, scalar_registers=108, source=f"{_ROCM}: MI200, 64 KiB LDS"),
    "gfx942": LaunchLimits(65536, 512, 131072, scalar_registers=108, source=f"{_ROCM}: MI300, 64 KiB LDS"),
    "gfx950": LaunchLimits(163840, 512, 131072, scalar_registers=108, source=f"{_ROCM}: MI350, 160 KiB LDS"),
}


def launch_limits(target: Target) -> LaunchLimits:
    """The target's row of ``LIMITS``; for a target without one, those of its compute capability
    (shared memory per block by the CUDA guide's table: 163 KB for 8.0/8.7, 227 KB for 9.x-11.x, 99 KB
    for the other 8.x and 12.x) or of its gfx generation (160 KiB of LDS on gfx95x, else 64 KiB)."""
    known = LIMITS.get(target.name)
    if known is not None:
        return known
    if target.is_nvidia:
        arch = int(target.arch)
        shared = 166912 if arch in (80, 87) else 232448 if 90 <= arch < 120 else 101376
        return LaunchLimits(shared, 255, 65536, tensor_memory=512 if 100 <= arch < 120 else None,
                            source=f"{_CUDA_GUIDE}: by compute capability {arch // 10}.{arch % 10}")
    lds = 163840 if str(target.arch).startswith("gfx95") else 65536
    return LaunchLimits(lds, 512, 131072, scalar_registers=108, source=f"{_ROCM}: by gfx generation")


class NoBenchmarkError(RuntimeError):
    """An autotuner wanted to benchmark where no kernel may run."""


class _TargetUtils:
    """The part of a driver's ``utils`` launchers query: device properties, for the target."""

    def __init__(self, target: Target):
        self.target = target

    def get_device_properties(self, device=None) -> dict:
        return device_properties(self.target).triton_dict(self.target.warp_size)


class TargetOnlyDriver:
    """Answers what Triton's compile path asks a driver; launches nothing.

    Each instance reports a device of its own, so the per-device caches Triton keeps on every
    ``JITFunction`` (binder, in-memory kernels) start empty: a trace under it sees every key.
    """

    _ids = itertools.count()

    def __init__(self, target: Target):
        self.target = target
        self.device = f"tritonwarm:{target.name}:{next(self._ids)}"

    def get_current_target(self) -> GPUTarget:
        return self.target.gpu_target

    def get_current_device(self):
        return self.device

    def get_current_stream(self, device=None):
        return 0

    def is_active(self) -> bool:
        return True

    @property
    def utils(self) -> _TargetUtils:
        return _TargetUtils(self.target)

    def get_active_torch_device(self):
        import torch

        return torch.device("meta")

    def get_device_interface(self):
        import torch

        return torch.cuda

    def map_python_to_cpp_type(self, ty: str) -> str:
        from triton.backends.nvidia.driver import ty_to_cpp

        return ty_to_cpp(ty)

    def get_benchmarker(self):
        """Triton's autotuner asks for this before it benchmarks; under this driver nothing may run,
        so the benchmarker refuses with the ways to give the autotuner its winner instead."""
        target = self.target.name

        def refuse(kernel_call, *args, **kwargs):
            raise NoBenchmarkError(
                f"an autotuner wanted to benchmark on {target}, where no kernel runs: pin a config in the "
                "spec (config:) or run `tritonwarm tune --target local` on that GPU")

        return refuse

    def get_empty_cache_for_benchmark(self):
        import torch

        return torch.empty(0, device="meta")

    def clear_cache(self, cache) -> None:
        return None


_driver_lock = threading.RLock()


@contextlib.contextmanager
def target_driver(target: Target):
    """Make Triton compile for ``target`` inside the block, whatever GPU (if any) this machine has."""
    fake = TargetOnlyDriver(target)
    with _driver_lock:
        previous = driver._active
        driver.set_active(fake)
        try:
            yield fake
        finally:
            driver._active = previous


@contextlib.contextmanager
def target_device_answers(target: Target):
    """Inside the block, host code asking torch about "the" GPU gets ``target``'s answers.

    Covers ``torch.cuda.is_available / get_device_properties / get_device_capability / get_device_name /
    current_device / current_stream / device_count / device(i)`` and ``torch.version.hip`` /
    ``torch.version.cuda`` (``is_hip()``-style checks; Triton's backends ask ``is_available`` and
    ``torch.version.hip`` whether their driver is active, so the target's backend answers yes);
    Triton's own ``driver.active`` questions are answered by ``TargetOnlyDriver``. Everything is put
    back on exit.
    """
    import torch

    props = device_properties(target)
    stream = SimpleNamespace(cuda_stream=0, stream_id=0, device_index=0, device=torch.device("meta"),
                             synchronize=lambda: None, wait_stream=lambda *a: None, query=lambda: True)
    answers = {
        "get_device_properties": lambda device=None: props.torch_properties(target.warp_size),
        "get_device_capability": lambda device=None: (props.major, props.minor),
        "get_device_name": lambda device=None: props.name,
        "current_device": lambda: 0,
        "current_stream": lambda device=None: stream,
        "default_stream": lambda device=None: stream,
        "device_count": lambda: 1,
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "_lazy_init": lambda: None,
        "set_device": lambda device: None,
        "synchronize": lambda device=None: None,
        "_exchange_device": lambda device: 0,  # what ``with torch.cuda.device(i):`` calls
        "_maybe_exchange_device": lambda device: 0,
        "mem_get_info": lambda device=None: (props.total_memory, props.total_memory),
    }
    versions = {"hip": None if target.is_nvidia else "6.2.0", "cuda": "12.8" if target.is_nvidia else None}
    with _driver_lock:
        saved = {name: getattr(torch.cuda, name) for name in answers}
        saved_versions = {name: getattr(torch.version, name, None) for name in versions}
        for name, fn in answers.items():
            setattr(torch.cuda, name, fn)
        for name, value in versions.items():
            setattr(torch.version, name, value)
        try:
            yield props
        finally:
            for name, fn in saved.items():
                setattr(torch.cuda, name, fn)
            for name, value in saved_versions.items():
                setattr(torch.version, name, value)
