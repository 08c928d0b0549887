"""What the commands share: the arguments naming specs, targets and the cache; printing helpers."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from ..errors import printable
from ..output import notes_now, plural, say

SHIPPED_SPECS = Path(__file__).resolve().parent.parent / "warmup_specs"


CACHE_DIR_HELP = ("cache directory (default: $TRITONWARM_CACHE_DIR, else the folder Triton reads: "
                  "$TRITON_CACHE_DIR, else Triton's default ~/.triton/cache)")


class UsageError(ValueError):
    """Bad input: reported in one line (its message, no class name), exit code 2."""


_noted_old_default = False


def cache_dir_of(args) -> Path:
    """The cache folder the command uses (``--cache-dir``, ``TRITONWARM_CACHE_DIR``, else the folder
    Triton reads); once a run, a line on stderr for a cache left in tritonwarm's old default folder."""
    global _noted_old_default
    from ..jit.cache.layout import old_default_note, resolve_cache_dir

    explicit = getattr(args, "cache_dir", None)
    note = None if _noted_old_default else old_default_note(explicit)
    if note:
        _noted_old_default = True
        print(f"tritonwarm: {note}", file=sys.stderr)
    return resolve_cache_dir(explicit)


def add_cache_args(p):
    p.add_argument("--cache-dir", help=CACHE_DIR_HELP)
    p.add_argument("--json", action="store_true", help="machine-readable output")


def read_cache_dir(args) -> Path:
    """The cache a reading command uses, refused in one line where it is a file or lies under one."""
    from ..jit.cache import check_cache_dir

    cache_dir = cache_dir_of(args)
    check_cache_dir(cache_dir, for_writing=False)
    return cache_dir


SERVE_AT_HELP = ("the path the server mounts this cache folder at, when it differs from --cache-dir (an init "
                 "container): Triton's group files name each file by absolute path")


def serve_at_arg(path: str | None, cache_dir) -> Path | None:
    """``--serve-at``: where the server mounts the cache, or None when that is where it is."""
    if path is None:
        return None
    if not os.path.isabs(path):
        raise UsageError(f"--serve-at {path!r} is not an absolute path: Triton's group files name absolute paths")
    serve_at = Path(os.path.normpath(path))
    return None if serve_at == Path(cache_dir).absolute() else serve_at


def target_name(args) -> str | None:
    """``--target`` as Triton's target name, None when not given; an unknown one is refused, not
    matched against nothing."""
    from ..jit.core.targets import resolve_target

    return resolve_target(args.target).name if args.target else None


def add_spec_args(p):
    p.add_argument("specs", nargs="*", metavar="SPEC_OR_DIR",
                   help="YAML specs or directories of them (default: the shipped warmup_specs/, unless "
                        "--engine-config is given)")
    p.add_argument("--engine-config", metavar="CONFIG",
                   help="also (or, without specs, only) what this engine config launches: a preset "
                        "(tiny, deepseek-v2-lite) or a YAML/JSON file")
    p.add_argument("--target", help="comma-separated: sm80, sm90, sm100, sm120, gfx942, gfx950, ..., a GPU name "
                                    "(h100, b200, mi300x, ...: `tritonwarm targets` lists them) or local "
                                    "(default: this machine's GPU)")
    add_cache_args(p)


def prepare(args):
    from ..jit.core.targets import resolve_targets
    from ..jit.pipeline.progress import set_phase
    from ..jit.pipeline.specs import load_specs

    if os.environ.get("TRITON_INTERPRET") == "1":
        raise UsageError("TRITON_INTERPRET=1 is set: nothing compiles under the interpreter; unset it to warm up")
    targets = resolve_targets(args.target)
    if args.engine_config:
        from ..engine.config import load_engine_config

        load_engine_config(args.engine_config)  # bad input fails here, before anything is traced
    specs = load_specs(args.specs) if args.specs else [] if args.engine_config else load_specs([SHIPPED_SPECS])
    what = " and ".join([plural(len(specs), "spec")] * bool(specs) +
                        [f"the engine config {args.engine_config}"] * bool(args.engine_config))
    cache_dir = cache_dir_of(args)
    notes_now(Path(cache_dir) / "tritonwarm")  # the input is good: the notes, before any result
    set_phase(f"tracing {what} for {', '.join(t.name for t in targets)}")
    return specs, targets, cache_dir


def plan_with_engine(args, specs, target, **kwargs):
    """The specs' plan, plus the engine config's when one is given."""
    return plan_all(args, specs, [target], **kwargs)[target.name]


def plan_all(args, specs, targets, pool=None, **kwargs):
    """Each target's plan: the specs', plus the engine config's when one is given; traced in
    ``pool``'s workers when one is given (the engine's traces start first: they are the longest).
    With ``cache_dir`` the engine's plan, like each spec's, comes from the plan store when its
    inputs did not change."""
    from ..jit.pipeline.plan import Plan, kernel_source_keys, plan_targets, storable, stored_plan

    engine_parts = {}
    if args.engine_config:
        from ..engine.config import load_engine_config
        from ..engine.plan import engine_config_source, engine_plan, engine_plan_json
        from ..jit.cache import PlanStore

        cache_dir = kwargs.get("cache_dir")
        store = PlanStore(cache_dir) if cache_dir is not None else None
        config = load_engine_config(args.engine_config)
        for target in targets:
            key = store.engine_key(repr(config), target) if store else None
            stored = stored_plan(store, key, target) if store else None
            if stored is not None:
                part = stored
            elif pool is not None:
                part = pool.submit(engine_plan_json, str(args.engine_config), target.name)
            else:
                part = engine_plan(config, target)
            engine_parts[target.name] = (part, key if stored is None else None)
    plans = plan_targets(specs, targets, pool=pool, **kwargs)
    for target in targets:
        if target.name in engine_parts:
            part, key = engine_parts[target.name]
            if not isinstance(part, Plan):
                part = Plan.from_json(target, part.result())
            if key is not None and storable(part):
                store.save(key, part.to_json(), kernel_source_keys(part))
            part.sources["engine_configs"] = [engine_config_source(args.engine_config)]
            plans[target.name].merge(part)
    return plans


def note_where_triton_reads(cache_dir) -> None:
    """Print a note when Triton in this environment reads another folder than ``cache_dir`` (its
    ``TRITON_CACHE_DIR`` unset or elsewhere): serving from ``cache_dir`` needs it pointed there, with the
    lines that do it. Also when ``cache_dir`` is Triton's default: ``torch.compile`` sets
    ``TRITON_CACHE_DIR`` when it is unset. And when a kernel the cache lacks would fail here rather than
    compile (a read-only cache, no overlay). Nothing when keyed for another environment (``--for``): this
    machine is not the server."""
    from ..jit.cache.env import keyed_for_another
    from ..jit.cache.overlay import misses_fail_here
    from ..jit.cache.triton_dir import triton_reads_instead
    from ..jit.cache.warmed import warmed_folder_in_force

    if keyed_for_another():
        return
    read = triton_reads_instead(cache_dir)
    unset = os.environ.get("TRITON_CACHE_DIR") is None and warmed_folder_in_force() is None
    if read is not None:
        wrap_print("  note: ", f"Triton in this environment reads {read}: serve with TRITON_CACHE_DIR={cache_dir}")
    elif unset:  # read as Triton's default, until torch.compile moves it
        wrap_print("  note: ", "TRITON_CACHE_DIR is unset: Triton reads this folder by default, until torch.compile "
                   f"points it at Inductor's: serve with TRITON_CACHE_DIR={cache_dir}")
    if read is not None or unset:
        for line in serving_env_lines(cache_dir):
            wrap_print("    ", line)
    fails = misses_fail_here(cache_dir)
    if fails:
        wrap_print("  note: ", fails)


def serving_env_lines(cache_dir) -> list[str]:
    """The lines that put ``cache_dir`` where a server's Triton reads, ready to paste: a Dockerfile's,
    a systemd unit's, and for an engine that sets ``TRITON_CACHE_DIR`` itself (SGLang) the cache manager
    that reads the folder first whatever it says."""
    from ..jit.cache.warmed import MANAGER, WARMED_ENV

    folder = str(cache_dir)
    quoted = f'"{folder}"' if any(c.isspace() or c in "\"'$\\" for c in folder) else folder
    return [f"Dockerfile: ENV TRITON_CACHE_DIR={quoted}",
            f'systemd unit: Environment="TRITON_CACHE_DIR={folder}"',
            f"SGLang, which sets TRITON_CACHE_DIR itself: ENV TRITON_CACHE_MANAGER={MANAGER} {WARMED_ENV}={quoted}"]


wrap_print = say  # ``prefix + text`` wrapped to the terminal (``output.say``)


def short_kernel(kernel: str) -> str:
    return printable(kernel.rsplit(".", 1)[-1])  # a name a cache or a bundle chose: escaped


def format_args(args: dict) -> str:
    """Compact: ``x_ptr:*bf16 n:i32:div16 BLOCK=4096``; only unaligned pointers are marked."""
    parts = []
    for name, cls in args.items():
        if cls.startswith("="):
            parts.append(f"{name}{cls}")
        else:
            parts.append(f"{name}:{cls.replace(' aligned', '').replace(' unaligned', '@unaligned')}")
    return printable(" ".join(parts))


def public_entry(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k != "specialization_data"}


class progress_bar:
    """A tqdm bar on a terminal; elsewhere (a log) the progress lines say how many of the variants are
    done (``warming sm90: 12/86 variants``); --json output stays clean."""

    def __init__(self, total: int, desc: str, quiet: bool):
        from ..jit.pipeline.progress import paused, set_phase

        self.bar, self.paused = None, contextlib.nullcontext()
        self.desc, self.total, self.done = desc, total, 0
        set_phase(f"{desc}: 0/{total} variants")
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="variant", file=sys.stderr, leave=False)
            self.paused = paused()  # the bar says it
        self.paused.__enter__()

    def __enter__(self):
        def tick(variant, outcome):
            from ..jit.pipeline.progress import set_phase

            self.done += 1
            set_phase(f"{self.desc}: {self.done}/{self.total} variants")
            if self.bar is not None:
                self.bar.set_postfix_str(f"{short_kernel(variant.kernel)} {outcome}", refresh=False)
                self.bar.update(1)

        return tick

    def __exit__(self, *exc):
        self.paused.__exit__(*exc)
        if self.bar is not None:
            self.bar.close()
