"""The plain Triton process of ``check --plain``: this file runs as a script, in its own Python process,
never imported. It imports the standard library, Triton, and the modules that define the kernels (the
device code a server imports too), and refuses every other tritonwarm module: no tracer, no fake
driver, no fake tensor, no key computed by tritonwarm.

For each planned variant it rebuilds the compile request from the cache's own record of it (the
``specialization_data`` Triton serialized when the entry was warmed, kept in the cache's manifest; the
plan's where the manifest has none), with the launch options Triton's key names and the options a
serving process sets from its environment (``debug``, ...), and asks Triton to compile it for the
target: ``triton.compile(ASTSource(...), target=GPUTarget(...))``, reading ``TRITON_CACHE_DIR``.
Triton's compile listener counts the cache hits; a request Triton would compile is stopped where
compiling starts (``ASTSource.make_ir``), so nothing is compiled or written.

    python -c "$(cat plain_triton.py)" REQUEST.json RESULT.json
"""

import ast
import importlib
import json
import os
import sys


class _NoTritonwarmMachinery:
    """An import hook: ``tritonwarm`` and ``tritonwarm.kernels*`` (device code) import; nothing else of it."""

    def find_spec(self, name, path=None, target=None):
        if name.startswith("tritonwarm.") and not (name == "tritonwarm.kernels" or
                                                  name.startswith("tritonwarm.kernels.")):
            raise ImportError(f"{name}: the plain Triton process imports none of tritonwarm's machinery")
        return None


class _WouldCompile(Exception):
    pass


def _tuples(value):
    """JSON writes tuples as lists: back to tuples (Triton's signatures hold no lists)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _import_object(locator):
    """``module:qualname``, or Triton's ``module.qualname`` (the longest importable module prefix)."""
    if ":" in locator:
        module_name, qualname = locator.split(":", 1)
        if module_name.endswith(".py"):
            raise LookupError(f"{locator}: defined in a program's script, which a plain process does not run")
        obj = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj
    parts = locator.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError as e:
            if e.name and ".".join(parts[:i]).startswith(e.name):
                continue  # not a module of that name: a shorter prefix may be
            raise
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise LookupError(f"{locator}: no importable module in its name")


def _jit_function(locator):
    from triton.runtime.jit import JITFunction

    obj = _import_object(locator)
    while not isinstance(obj, JITFunction) and hasattr(obj, "fn"):  # @triton.autotune, @triton.heuristics
        obj = obj.fn
    if not isinstance(obj, JITFunction):
        raise LookupError(f"{locator} is not a @triton.jit function")
    return obj


def _constant(value):
    """A constexpr as Triton serialized it: a dtype by name, ``{"constexpr": v}``, ``{"jit_function": ...}``."""
    import triton.language as tl

    if isinstance(value, str) and tl.dtype.is_dtype(value):
        return tl.dtype(value)
    if isinstance(value, dict) and "constexpr" in value:
        return tl.constexpr(_tuples(value["constexpr"]))
    if isinstance(value, dict) and "jit_function" in value:
        return _jit_function(value["jit_function"])
    return _tuples(value)


def _launch_options(data, fn):
    """The options a serving launch hands Triton: those its key names (the launch's own, as warmed),
    with the ones a server takes from its environment set as this process's environment has them.
    None where the key has no options (Triton then gets the options the entry was warmed with)."""
    from triton import knobs

    key = data.get("key") or ""
    start = key.rfind("]{")
    try:
        options = ast.literal_eval(key[start + 1:]) if start >= 0 else None
    except (ValueError, SyntaxError):
        options = None
    if not isinstance(options, dict):
        return None
    from_environment = {  # JITFunction.run sets these from the process's knobs at every launch
        "debug": lambda: bool(getattr(fn, "debug", None)) or bool(knobs.runtime.debug),
        "instrumentation_mode": lambda: knobs.compilation.instrumentation_mode,
        "fpsan_homomorphic_casts": lambda: knobs.compilation.fpsan_homomorphic_casts,
    }
    for name, value in from_environment.items():
        if name in options:
            options[name] = value()
    return {name: _tuples(value) for name, value in options.items()}


def _request(data, fn):
    from triton.compiler.compiler import ASTSource

    signature = {name: _tuples(kind) for name, kind in data["signature"].items()}
    constexprs = {tuple(k): _constant(v) for k, v in zip(data["constant_keys"], data["constant_vals"], strict=True)}
    attrs = {tuple(k): v for k, v in zip(data["attrs_keys"], data["attrs_vals"], strict=True)}
    options = _launch_options(data, fn)
    if options is None:
        options = {name: _tuples(value) for name, value in data["options"].items()}
    return ASTSource(fn, signature, constexprs, attrs), options


def _manifest_rows(cache_dir, target):
    try:
        with open(os.path.join(cache_dir, "tritonwarm", f"manifest-{target}.json")) as f:
            rows = json.load(f).get("variants")
    except (OSError, ValueError, AttributeError):
        return {}
    return rows if isinstance(rows, dict) else {}


def main(request_path, result_path):
    with open(request_path) as f:
        request = json.load(f)
    sys.path[:] = request["sys_path"]  # the import roots of the process that planned (a spec's own folders)
    sys.meta_path.insert(0, _NoTritonwarmMachinery())

    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compiler

    hits = []

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        if cache_hit:
            hits.append(src)

    def would_compile(*args, **kwargs):
        raise _WouldCompile()

    knobs.compilation.listener = listener
    compiler.ASTSource.make_ir = would_compile  # where Triton starts compiling what its cache lacks
    cache_dir = knobs.cache.dir
    before = set(os.listdir(cache_dir)) if os.path.isdir(cache_dir) else set()
    rows = {}
    results = []
    for item in request["variants"]:
        if item["target"] not in rows:
            rows[item["target"]] = _manifest_rows(request["cache_dir"], item["target"])
        recorded = rows[item["target"]].get(item["cache_hash"])
        recorded = recorded.get("specialization_data") if isinstance(recorded, dict) else None
        result = {"id": item["id"], "source": "manifest" if recorded else "plan"}
        try:
            data = json.loads(recorded or item["specialization_data"])
            fn = _jit_function(item["jit_function"] or data["name"])
            src, options = _request(data, fn)
            found = len(hits)
            kernel = triton.compile(src, target=GPUTarget(*item["gpu_target"]), options=options)
            result["outcome"] = "hit" if len(hits) > found else "compiled"
            result["hash"] = kernel.hash
        except _WouldCompile:
            result["outcome"] = "compile"
        except Exception as e:  # noqa: BLE001 (an import, a lookup: named, and the next variant goes on)
            result["outcome"], result["why"] = "error", " ".join(f"{type(e).__name__}: {e}".split())[:300]
        results.append(result)
    for name in (set(os.listdir(cache_dir)) if os.path.isdir(cache_dir) else set()) - before:
        try:  # Triton makes an entry's folder at each lookup: none is left behind
            os.rmdir(os.path.join(cache_dir, name))
        except OSError:
            pass
    with open(result_path, "w") as f:
        json.dump({"triton": triton.__version__, "cache_dir": str(cache_dir), "results": results,
                   "tritonwarm_modules": sorted(m for m in sys.modules if m.split(".")[0] == "tritonwarm")}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
