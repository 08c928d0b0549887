"""Redis read-through vs a local disk hit, per variant, measured in the same run.

Warms the specs for ``--target`` into a temporary local cache, starts a ``redis-server`` on the
loopback, pushes every entry, then times Triton's own ``JITFunction.preload`` finding each variant:

- **local disk hit**: Triton's ``FileCacheManager`` on the warmed cache;
- **Redis read-through**: ``RedisCacheManager`` (``TRITON_CACHE_MANAGER``) on an empty local cache,
  so every lookup fetches the entry from Redis, checks its hashes and writes it to disk;
- **of which Redis**: the fetch and hash check alone (``RedisStore.read_entry``); the rest is writing
  the entry's files into the local cache, the way Triton writes a compiled entry.

    python bench/remote_cache.py --target sm90 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _common import table  # noqa: E402

SPECS = Path(__file__).resolve().parent.parent / "warmup_specs"


def start_redis(folder: Path) -> tuple[subprocess.Popen, str]:
    import redis

    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (Debian: apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.2)
    for _ in range(100):
        try:
            client.ping()
            return proc, f"redis://127.0.0.1:{port}"
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("redis-server did not start")


def lookup_ms(variant, target, cache_dir: Path) -> float:
    from tritonwarm.jit.pipeline.compile import compile_variant

    start = time.perf_counter()
    compile_variant(variant, target, cache_dir)
    return (time.perf_counter() - start) * 1e3


def fetch_ms(store, variant) -> float:
    start = time.perf_counter()
    assert store.read_entry(variant.entry_dir, f"__grp__{variant.entry_name[:150]}.json") is not None
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("specs", nargs="*", default=[str(SPECS / "rms_norm.yaml"), str(SPECS / "silu_and_mul.yaml")])
    parser.add_argument("--target", default="sm90")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    from tritonwarm.jit.cache import entry_files
    from tritonwarm.jit.cache.remote import RedisStore, push
    from tritonwarm.jit.core.targets import resolve_target
    from tritonwarm.jit.pipeline.plan import plan
    from tritonwarm.jit.pipeline.specs import load_specs

    target = resolve_target(args.target)
    root = Path(tempfile.mkdtemp(prefix="tritonwarm-bench-remote-"))
    proc, url = start_redis(root)
    try:
        from tritonwarm.jit.pipeline.warmup import warm

        the_plan = plan(load_specs(args.specs), target)
        local = root / "local"
        warm(the_plan, local)
        store = RedisStore(url)
        report = push(the_plan.variants.values(), local, store, target.name)
        assert report.ok, report.to_json()

        compiles = _count_compiles()
        rows, local_total, remote_total, redis_total = [], 0.0, 0.0, 0.0
        for variant in the_plan.variants.values():
            files = entry_files(local, variant.entry_dir, variant.entry_name)
            size_kb = sum(os.path.getsize(p) for p in files.values()) / 1024
            hit = statistics.median(lookup_ms(variant, target, local) for _ in range(args.repeat))
            os.environ.update(TRITON_CACHE_MANAGER="tritonwarm.jit.cache.remote:RedisCacheManager",
                              TRITONWARM_REDIS_URL=url)
            try:
                fetched = statistics.median(lookup_ms(variant, target, Path(tempfile.mkdtemp(dir=root)))
                                            for _ in range(args.repeat))
            finally:
                del os.environ["TRITON_CACHE_MANAGER"], os.environ["TRITONWARM_REDIS_URL"]
            redis_only = statistics.median(fetch_ms(store, variant) for _ in range(args.repeat))
            local_total += hit
            remote_total += fetched
            redis_total += redis_only
            rows.append([variant.kernel.rsplit(".", 1)[-1], variant.variant_id, f"{size_kb:.0f}", f"{hit:.2f}",
                         f"{fetched:.2f}", f"{redis_only:.2f}", f"{fetched / hit:.1f}x"])
        if compiles() != 0:
            raise SystemExit(f"{compiles()} lookups compiled: the measurement is not of cache hits")
        rows.append(["total", f"{len(rows)} variants", "", f"{local_total:.1f}", f"{remote_total:.1f}",
                     f"{redis_total:.1f}", f"{remote_total / local_total:.1f}x"])
    finally:
        proc.kill()
        proc.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)
    import triton

    table(f"Redis read-through vs local disk hit, {target.name}, Triton {triton.__version__}, median of {args.repeat}",
          ["kernel", "variant", "files KiB", "local hit ms", "Redis read-through ms", "of which Redis ms",
           "read-through / local"], rows,
          f"python bench/remote_cache.py --target {target.name} --repeat {args.repeat}")


def _count_compiles():
    """Counts Triton's compiles (``ASTSource.make_ir``) from now on: a lookup must compile nothing."""
    from triton.compiler import compiler

    count = [0]
    original = compiler.ASTSource.make_ir

    def counting(src, *a, **kw):
        count[0] += 1
        return original(src, *a, **kw)

    compiler.ASTSource.make_ir = counting
    return lambda: count[0]


if __name__ == "__main__":
    main()
