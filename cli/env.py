"""``tritonwarm env``: the environment every key depends on, as data; and ``--for`` / ``--for-wheel``,
shared by the commands that key for a serving environment other than this process's."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import textwrap
from pathlib import Path

from ..output import width


def add_parsers(sub) -> None:
    e = sub.add_parser("env", help="what enters every key here: Triton's key parts, Python, backends, cache env")
    e.add_argument("--json", action="store_true", help="the fingerprint as JSON")
    e.add_argument("-o", "--output", metavar="FILE",
                   help="write the fingerprint to FILE (for warmup --for FILE on a build machine)")
    e.set_defaults(func=cmd_env)


def add_for_args(p) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--for", dest="for_env", metavar="ENV.json",
                       help="key for the serving environment this fingerprint (tritonwarm env -o) describes")
    group.add_argument("--for-wheel", metavar="TRITON.whl",
                       help="key for a runtime with this Triton wheel (the serving Python's build of this release)")


@contextlib.contextmanager
def for_environment(args, targets=()):
    """Key as the environment ``--for`` / ``--for-wheel`` names inside the block (nothing when neither)."""
    from ..jit.cache.serving import fingerprint_from_wheel, load_fingerprint, serving_environment

    if getattr(args, "for_env", None):
        fp, source = load_fingerprint(args.for_env), args.for_env
    elif getattr(args, "for_wheel", None):
        fp, source = fingerprint_from_wheel(args.for_wheel), args.for_wheel
    else:
        yield None
        return
    with serving_environment(fp, targets=[t.name for t in targets], source=source,
                             warmed_from=os.path.basename(source)) as recorded:
        yield recorded


def keyed_for(command):
    """Run ``command`` keyed for the ``--for`` / ``--for-wheel`` environment, when one is given."""

    @functools.wraps(command)
    def run(args) -> int:
        if not (getattr(args, "for_env", None) or getattr(args, "for_wheel", None)):
            return command(args)
        from ..jit.cache.env import python_name
        from ..jit.core.targets import UnknownTargetError, resolve_targets

        try:  # the targets whose backends must agree; none named (prune) and no GPU: none checked
            targets = resolve_targets(args.target)
        except UnknownTargetError:
            targets = []
        with for_environment(args, targets) as serving:
            if not args.json:
                print(f"keying for {serving['warmed_for']['source']}: {python_name(serving)}'s libtriton "
                      f"({serving['triton']['libtriton_sha256'][:8]}…), compiling with this Triton")
            return command(args)

    return run


def cmd_env(args) -> int:
    from ..jit.cache.env import fingerprint, fingerprint_id
    from ..jit.cache.layout import write_json_atomic

    fp = fingerprint()
    if args.output:
        out = Path(args.output)
        if out.is_dir():
            raise ValueError(f"-o {out}: is a directory; name a file")
        if not out.parent.is_dir():
            raise ValueError(f"-o {out}: {out.parent} is not a directory")
        if out.exists() and not out.is_file():  # /dev/stdout, a pipe: written to, never replaced
            with open(out, "w") as f:
                f.write(json.dumps(fp, indent=1) + "\n")
        else:  # a link is followed: its target is replaced, the link stays
            write_json_atomic(out.resolve(), fp, indent=1)
    if args.json:
        print(json.dumps(fp, indent=1))
    elif args.output:
        print(f"wrote {args.output}: fingerprint {fingerprint_id(fp)} (Triton {fp['triton']['version']}, "
              f"Python {fp['python']['version']})")
    else:
        from ..jit.cache.env import cache_bypassed

        bypassed = cache_bypassed()
        lines = format_env(fp) + [gpu_line(), *cache_lines()] + ([f"WARNING      {bypassed}"] if bypassed else [])
        columns = width()
        for line in lines:  # as wide as the terminal, continued under the value column
            print("\n".join(textwrap.wrap(line, columns, subsequent_indent=" " * 13, break_long_words=False,
                                           break_on_hyphens=False)) or line)
    return 0


def cache_lines() -> list[str]:
    """Where Triton in this process reads its cache and writes what it compiles, and a warning when
    a kernel the cache lacks would fail there instead of compiling (a read-only folder)."""
    from triton import knobs

    from ..jit.cache.overlay import OVERLAY_ENV, misses_fail_here, overlay_in_force
    from ..jit.cache.warmed import WARMED_ENV, warmed_folder_in_force

    read = Path(knobs.cache.dir).expanduser().absolute()
    why = "TRITON_CACHE_DIR" if os.environ.get("TRITON_CACHE_DIR") else "its default: TRITON_CACHE_DIR is unset"
    overlay = overlay_in_force()
    writes = f"writes what it compiles to {overlay} ({OVERLAY_ENV})" if overlay else "writes what it compiles there"
    warmed = warmed_folder_in_force()
    if warmed is not None:  # WarmedCacheManager: the warmed folder first, whatever TRITON_CACHE_DIR says
        return [f"cache        Triton reads {warmed} ({WARMED_ENV}, WarmedCacheManager) first, then {read} ({why}), "
                "and writes what it compiles there"]
    fails = misses_fail_here(read)
    return [f"cache        Triton reads {read} ({why}) and {writes}"] + ([f"WARNING      {fails}"] if fails else [])


def gpu_line() -> str:
    """The target a cache for this machine's GPU is warmed for (what ``--target local`` means here)."""
    from ..jit.core.targets import local_target

    target = local_target()
    if target is None:
        return "GPU          none: warm for the serving GPU's target by name (--target sm90, gfx942, ...)"
    import torch

    return f"GPU          {torch.cuda.get_device_name()}: target {target.name} (--target local warms it)"


def format_env(fp: dict) -> list[str]:
    from ..jit.cache.env import backend_name, fingerprint_id

    t, py, build = fp["triton"], fp["python"], fp["build"]
    by_tool: dict[str, list[str]] = {}
    for name, backend_hash in fp["backends"].items():
        by_tool.setdefault(backend_name(backend_hash, build=True), []).append(name)
    lines = [
        f"fingerprint  {fingerprint_id(fp)}",
        f"Triton       {t['version']}: key {t['key_sha256'][:12]}…, libtriton {t['libtriton_sha256'][:12]}…, "
        f"Python sources {t['sources_sha256'][:12]}…",
        f"Python       {py['version']} ({py['implementation']}), extensions {py['ext_suffix']}, {fp['platform']}",
        "backends     " + "; ".join(f"{tool}: {', '.join(names)}" for tool, names in by_tool.items()),
        "cache env    (every key depends on these; warm-up and serving must agree)",
    ]
    for name, value in fp["env"].items():
        lines.append(f"  {name}={value}")
    if "TRITON_DEFAULT_FP_FUSION" in fp["env_unset"]:
        lines.append("  TRITON_DEFAULT_FP_FUSION is unset: setting it, even to its default, changes every key; "
                     "set it identically when warming and serving")
    lines += textwrap.wrap("unset: " + ", ".join(fp["env_unset"]), 100, initial_indent="  ",
                           subsequent_indent="    ")
    cc = build["c_compiler"] if build["c_compiler_found"] else f"none found ({build['c_compiler'] or 'gcc, clang'})"
    headers = "found" if build["python_headers"] else "MISSING"
    lines.append(f"C launchers  compiler {cc}; Python headers {headers} ({build['python_include']})"
                 + ("; a custom knobs.build.impl is set" if build["custom_build"] else ""))
    return lines + _machine_keyed_utilities()


def _machine_keyed_utilities() -> list[str]:
    """Driver utilities keyed by where the driver library is (CUDA from Triton 3.8, AMD always): say
    whether warm-up here can build them (Triton finds the library, or ``TRITON_LIBCUDA_PATH`` /
    ``TRITON_LIBHIP_PATH`` names it) or the serving machine must."""
    from ..jit.cache.env import keyed_for_another

    if keyed_for_another():
        return []
    return _cuda_utilities() + _hip_utilities()


def _cuda_utilities() -> list[str]:
    import importlib

    import triton

    from ..jit.serving.c_launchers import machine_utilities_call, utilities_keyed_by_source

    if utilities_keyed_by_source():
        return []
    if machine_utilities_call("cuda") is None:
        return [f"cuda_utils   no libcuda.so.1 here: Triton {triton.__version__} keys it by the serving machine's "
                "and builds it there at its first launch (for a read-only cache, warm on a serving machine or set "
                "TRITON_LIBCUDA_PATH to where the servers have it)"]
    dirs = importlib.import_module("triton.backends.nvidia.driver").libcuda_dirs()
    if any(os.path.exists(os.path.join(d, "libcuda.so.1")) for d in dirs):
        return [f"cuda_utils   keyed by this machine's libcuda.so.1 in {', '.join(dirs)}: warmup here builds it"]
    return [f"cuda_utils   keyed by libcuda.so.1 in {', '.join(dirs)} (TRITON_LIBCUDA_PATH; not on this machine): "
            "warmup here builds it for servers that have it there and set the same TRITON_LIBCUDA_PATH"]


def _hip_utilities() -> list[str]:
    """Only where a HIP runtime is found or named: a CUDA machine has nothing to say about it."""
    from ..jit.serving.c_launchers import hip_runtime_path

    path = hip_runtime_path()
    return [f"hip_utils    keyed by the HIP runtime {path}: warmup here builds it (and Triton 3.6's launchers)"] \
        if path else []
