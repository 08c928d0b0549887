"""Do warmed keys equal runtime keys, and does the cache hold the C launchers the runtime will build?

    python bench/runtime_keys.py [--targets sm90,gfx942,gfx950] [--launcher-targets sm90] [--jobs N]

Runtime-key agreement, per target: every shipped spec row is traced twice under the target-only
driver, once on the fake inputs warm-up uses and once on real CPU tensors of the same dtype, shape,
strides, storage offset and storage size; both keys are Triton's own (``jit_cache_hook``, nothing
compiles). The share of the runtime's distinct keys that warm-up also traced must be 100 %. Baseline,
measured in the same run: fake pointers that carry only a dtype and an address (no storage size).

C launcher coverage, per ``--launcher-targets`` target (this compiles): the shipped specs are warmed
into a fresh cache, then Triton's own driver code computes every C module the runtime needs for the
warmed variants and looks each up (nothing is built or loaded). Baseline: the same cache before the
launchers were built. Where Triton builds no launcher per signature (3.7 and later), there are none.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _common import table  # noqa: E402


@dataclass(frozen=True)
class _AddressOnlyPointer:
    """The fake pointer warm-up used to pass: dtype and address, no storage size."""

    dtype: object
    address: int

    def data_ptr(self) -> int:
        return self.address


@contextlib.contextmanager
def _address_only_fakes():
    from tritonwarm.jit.core import kernel
    from tritonwarm.jit.core.specialization import pointer_address

    original = kernel.as_kernel_arg

    def as_kernel_arg(value):
        converted = original(value)
        return _AddressOnlyPointer(value.dtype, pointer_address(value)) if converted is not value else value

    kernel.as_kernel_arg = as_kernel_arg
    try:
        yield
    finally:
        kernel.as_kernel_arg = original


def _keys(spec, target, args, kwargs) -> set[tuple[str, str]]:
    from tritonwarm.jit.core.kernel import fake_launches
    from tritonwarm.jit.core.trace import Capture

    cap = Capture()
    with fake_launches(cap, target):
        spec.launcher(*args, **kwargs)
    return {(v.kernel, v.key) for v in cap.variants.values()}


def key_agreement(specs, target, baseline: bool) -> tuple[int, int, int]:
    """(rows, runtime keys, runtime keys warm-up also traced) over every shipped spec row."""
    from tritonwarm.jit.core.specialization import cpu_twin

    runtime, warmed, rows = set(), set(), 0
    with _address_only_fakes() if baseline else contextlib.nullcontext():
        for spec in specs:
            if not spec.applies_to(target):
                continue
            for row in spec.rows():
                args, kwargs = spec.call_arguments(row.values)
                warmed |= _keys(spec, target, args, kwargs)
                runtime |= _keys(spec, target, cpu_twin(args), cpu_twin(kwargs))
                rows += 1
    return rows, len(runtime), len(runtime & warmed)


def launcher_coverage(specs, target, jobs: int) -> tuple[int, int, int, int, str]:
    """(variants, C modules needed, in the cache before building them, after, what warm-up said)."""
    from tritonwarm.jit.pipeline import warmup
    from tritonwarm.jit.pipeline.plan import plan
    from tritonwarm.jit.serving import c_launchers

    if not c_launchers.builds_c_modules(target.backend):
        return 0, 0, 0, 0, "this Triton builds no C launcher per signature"
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        the_plan = plan(specs, target)
        variants = list(the_plan.variants.values())
        build_launchers, warmup.warm_c_launchers = warmup.warm_c_launchers, lambda *a, **k: None
        try:  # the baseline: a warm-up of the kernels only
            result = warmup.warm(the_plan, cache, jobs=jobs)
        finally:
            warmup.warm_c_launchers = build_launchers
        assert result.failed == 0, result.failures
        needed, missing_before = c_launchers.look_up_c_launchers(variants, target, cache)
        report = c_launchers.warm_c_launchers(variants, target, cache, jobs=jobs)
        _, missing_after = c_launchers.look_up_c_launchers(variants, target, cache)
        note = report.summary() if report else "this Triton builds no C launcher per signature"
        return len(variants), needed, needed - len(missing_before), needed - len(missing_after), note


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "-"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", default="sm90,gfx942,gfx950")
    p.add_argument("--launcher-targets", default="sm90", help="targets to warm for the launcher coverage ('' for none)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = p.parse_args()
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # as the tests: Triton 3.9 warns when it is unset

    import triton
    from tritonwarm.cli import SHIPPED_SPECS
    from tritonwarm.jit.core.targets import resolve_targets
    from tritonwarm.jit.pipeline.specs import load_specs

    specs = load_specs([SHIPPED_SPECS])
    rows = []
    for target in resolve_targets(args.targets):
        n_rows, runtime, agreeing = key_agreement(specs, target, baseline=False)
        _, base_runtime, base_agreeing = key_agreement(specs, target, baseline=True)
        rows.append([target.name, n_rows, runtime, f"{agreeing}/{runtime}", _percent(agreeing, runtime),
                     _percent(base_agreeing, base_runtime)])
    command = f"python bench/runtime_keys.py --targets {args.targets} --launcher-targets {args.launcher_targets}"
    table(f"Runtime-key agreement, shipped specs (Triton {triton.__version__}, Python {sys.version.split()[0]})",
          ["target", "rows", "runtime keys", "warmed", "agreement", "baseline: fakes without storage size"],
          rows, command)
    if not args.launcher_targets:
        return
    rows = []
    for target in resolve_targets(args.launcher_targets):
        variants, needed, before, after, note = launcher_coverage(specs, target, args.jobs)
        rows.append([target.name, variants or "-", needed, f"{after}/{needed}", _percent(after, needed),
                     _percent(before, needed), note])
    table(f"C launcher coverage after warm-up (Triton {triton.__version__})",
          ["target", "variants", "C modules needed", "in cache", "coverage", "baseline: kernels only", "warm-up said"],
          rows, command)


if __name__ == "__main__":
    main()
