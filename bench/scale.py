"""Every command at scale: caches of 1,000, 5,000 and 25,000 entries, each command timed with its peak RSS.

    python bench/scale.py [--sizes 1000,5000,25000] [--shards 4] [--json FILE]

The entries are made cheaply, and are clones: the bench compiles the sm90 variants of one RMSNorm spec
(binary-only: cubin and metadata), then files copies of them under new cache hashes (each copy's metadata
rewritten to name its own hash, so it is a valid entry of that key), records a manifest row for each, and
stores a plan that names every entry under the spec's plan-store key, so `warmup` and `bundle create` plan
all N without tracing. What is measured is tritonwarm's bookkeeping, hashing and I/O; no clone is a kernel
Triton would compile for that key. `check` and `prune --unplanned` trace their specs afresh (they never read
the plan store), so their command rows plan the few real variants against a cache of N; the `check, N planned`
and `check --remote, N planned` rows run the same checks, in a process of their own, on the stored plan of N.

A bundle holds at most 2,000 entries (the caps its readers hold it to): above that the bundle rows are
one shard bundle of K, and the K shard bundles are installed one by one into one cache instead of merged.

Every row is a separate process: the seconds are its wall time, the RSS its peak resident memory
(``wait4``). Bookkeeping is the cost of recording one variant as a warm-up does (``Manifest.update``),
into a manifest of 100 entries and into one of N, compilation excluded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _common import save_json, table  # noqa: E402

TARGET = "sm90"
SPEC = """\
kernel: tritonwarm.launchers.rms_norm:rms_norm
axes:
  num_tokens: {range: [1, 4096], collapse: true}
  fused: [false, true]
  dtype: [bfloat16, float16]
args:
  x: {tensor: [$num_tokens, 4096], dtype: $dtype}
  weight: {tensor: [4096], dtype: $dtype}
  eps: 1.0e-6
  residual: {tensor: [$num_tokens, 4096], dtype: $dtype, when: $fused}
"""
GOAL_SECONDS = 15.0
GOAL_RSS_MB = 1024.0


def measure(args: list[str], env: dict | None = None) -> tuple[float, float, str]:
    """Run ``args`` in a process of its own: (wall seconds, peak RSS in MB, stdout); a failure stops the bench."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(args, stdout=out, stderr=err, env={**os.environ, **(env or {})})
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}): {stderr.strip()[-2000:]}")
    return seconds, usage.ru_maxrss / 1024, stdout


def bundle_cap() -> int:
    from tritonwarm.jit.cache.bundle import Limits

    return Limits().entries


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tritonwarm", *args]


def inner(*args: str) -> list[str]:
    return [sys.executable, __file__, "--inner", *args]


# ---- building a cache of N entries ------------------------------------------------------------------

def seed(work: Path) -> tuple[Path, Path]:
    """Compile the spec's real variants once (binary-only): the cache every clone is copied from."""
    spec = work / "scale.yaml"
    spec.write_text(SPEC)
    cache = work / "seed"
    measure(cli("warmup", str(spec), "--target", TARGET, "--cache-dir", str(cache), "--binary-only", "--json"))
    return spec, cache


def build(seed_cache: Path, cache: Path, n: int) -> dict:
    """A cache of ``n`` entries: the real ones, then clones under new hashes; one manifest row for each and
    the spec's stored plan naming all of them. Returns the figures of what was made."""
    from tritonwarm.jit.cache import Manifest
    from tritonwarm.jit.cache.layout import entry_dir_name, file_sha256

    shutil.copytree(seed_cache, cache, symlinks=True)
    manifest = Manifest(cache, TARGET)
    real = manifest.read()
    environments = manifest.environments()
    [plan_file] = (cache / "tritonwarm" / "plans").glob("*.json")
    stored = json.loads(plan_file.read_text())
    variants = {v["cache_hash"]: v for v in stored["plan"]["variants"]}
    seeds = sorted(real)
    for row in real.values():  # copied: the groups name the seed's folder, which a server of this one never sees
        folder = cache / row["entry_dir"]
        group = {"child_paths": {name: str(folder / name) for name in row["files"]}}
        (folder / f"__grp__{row['entry_name']}.json").write_text(json.dumps(group))
    rows, planned = {}, list(stored["plan"]["variants"])
    for i in range(n - len(seeds)):
        origin = seeds[i % len(seeds)]
        row = real[origin]
        cache_hash = hashlib.sha256(f"scale clone {i} of {origin}".encode()).hexdigest()
        folder = cache / entry_dir_name(cache_hash)
        folder.mkdir()
        files = {}
        for name in row["files"]:
            source = cache / row["entry_dir"] / name
            if name == f"{row['entry_name']}.json":  # Triton's metadata names the key its folder is filed under
                metadata = json.loads(source.read_text())
                metadata["hash"] = cache_hash
                (folder / name).write_text(json.dumps(metadata))
            else:
                shutil.copyfile(source, folder / name)
            files[name] = file_sha256(folder / name)
        group = {"child_paths": {name: str(folder / name) for name in row["files"]}}
        (folder / f"__grp__{row['entry_name']}.json").write_text(json.dumps(group))
        clone_rows = [f"scale.yaml#clone{i} (a copy of {origin[:12]})"]
        rows[cache_hash] = {**row, "id": cache_hash[:12], "cache_hash": cache_hash, "entry_dir": folder.name,
                            "files": files, "rows": clone_rows}
        planned.append({**variants[origin], "cache_hash": cache_hash, "id": cache_hash[:12], "rows": clone_rows})
    manifest.update(rows, environments=environments)  # all at once: building is not what is measured
    if hasattr(manifest, "compact"):
        manifest.compact()
    stored["plan"]["variants"] = planned
    from tritonwarm.jit.cache.plans import _digest

    stored["digest"] = _digest(stored)
    plan_file.write_text(json.dumps(stored))
    record = cache.parent / f"record-{n}.jsonl"  # a dispatch record in which every entry was launched, and hit
    with open(record, "w") as f:
        for v in planned:
            f.write(json.dumps({"kernel": v["kernel"], "target": TARGET, "variant": v["id"],
                                "cache_hash": v["cache_hash"], "hit": True, "args": v["args"], "launches": 1}) + "\n")
    return {"entries": n, "clones": n - len(seeds), "real": len(seeds), "bytes": _tree_bytes(cache, entries_only=True),
            "manifest_bytes": manifest.path.stat().st_size}


def _tree_bytes(folder: Path, entries_only: bool = False) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()
               and not (entries_only and p.relative_to(folder).parts[0] == "tritonwarm"))


# ---- what runs in a process of its own --------------------------------------------------------------

def _stored_plan(cache: str, spec: str):
    from tritonwarm.jit.core.targets import TARGETS
    from tritonwarm.jit.pipeline.plan import plan
    from tritonwarm.jit.pipeline.specs import load_specs

    return plan(load_specs([spec]), TARGETS[TARGET], cache_dir=Path(cache))


def inner_check(cache: str, spec: str, checked: str | None = None) -> None:
    from tritonwarm.jit.pipeline.check import check

    report = check(_stored_plan(cache, spec), Path(checked or cache))
    print(json.dumps({"planned": report.planned, "ok": report.ok, "missing": len(report.missing),
                      "corrupt": len(report.corrupt)}))


def inner_remote(cache: str, spec: str, url: str) -> None:
    from tritonwarm.jit.cache.remote import RedisStore, check_remote

    report = check_remote(_stored_plan(cache, spec).variants.values(), RedisStore(url, key=None), TARGET)
    print(json.dumps({"planned": report.planned, "ok": report.ok, "present": len(report.present)}))


def inner_shards(cache: str, spec: str, count: str) -> None:
    """Shards of the stored plan cover each variant exactly once."""
    from tritonwarm.jit.pipeline.shard import shard_plan

    whole = _stored_plan(cache, spec)
    parts = [set(shard_plan(whole, i, int(count)).variants) for i in range(1, int(count) + 1)]
    once = sum(len(p) for p in parts) == len(whole.variants) and set().union(*parts) == set(whole.variants)
    print(json.dumps({"planned": len(whole.variants), "shards": [len(p) for p in parts], "exactly_once": once}))


def inner_bookkeeping(cache: str, n: str) -> None:
    """Milliseconds to record one variant (as a warm-up does, with its environment) into a manifest of
    100 entries and into one of ``n``: the last 50 recorded one at a time."""
    from tritonwarm.jit.cache import Manifest

    source = Manifest(Path(cache), TARGET)
    rows, environments = source.read(), source.environments()
    ordered = sorted(rows.items())
    found = {}
    for size in (100, int(n)):
        with tempfile.TemporaryDirectory(dir=Path(cache).parent) as tmp:
            manifest = Manifest(Path(tmp), TARGET)
            manifest.update(dict(ordered[:size - 50]), environments=environments)
            if hasattr(manifest, "compact"):
                manifest.compact()
            start = time.perf_counter()
            for cache_hash, row in ordered[size - 50:size]:
                Manifest(Path(tmp), TARGET).update({cache_hash: row}, environments=environments)
            found[size] = (time.perf_counter() - start) / 50 * 1000
    print(json.dumps({"ms_at_100": found[100], "ms_at_n": found[int(n)]}))


def inner_build(seed_cache: str, cache: str, n: str) -> None:
    print(json.dumps(build(Path(seed_cache), Path(cache), int(n))))


INNER = {"build": inner_build, "check": inner_check, "remote": inner_remote, "shards": inner_shards,
         "bookkeeping": inner_bookkeeping}


# ---- the table --------------------------------------------------------------------------------------

def redis_server(work: Path):
    """A local redis-server on a free port, or None where none is installed."""
    exe = shutil.which("redis-server")
    if exe is None:
        return None, None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(work)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"redis://127.0.0.1:{port}/0"
        time.sleep(0.1)
    proc.terminate()
    return None, None


def at_size(work: Path, spec: Path, seed_cache: Path, n: int, shards: int, use_redis: bool) -> list[dict]:
    cache = work / f"cache-{n}"
    # built in a process of its own, so the bench stays small: a child's peak RSS (wait4) starts from
    # its parent's, which fork and exec carry over
    made = json.loads(measure(inner("build", str(seed_cache), str(cache), str(n)))[2])
    print(f"{n}: made {made['real']} real entries and {made['clones']} clones of them ({made['bytes'] / 1e6:.0f} MB "
          f"of entries, manifest {made['manifest_bytes'] / 1e6:.1f} MB)", flush=True)
    rows = []

    def row(what: str, command: list[str], *, mb: float | None = None, check=None, goal=GOAL_SECONDS) -> dict:
        seconds, rss, out = measure(command)
        note = check(out) if check else ""
        speed = f"{mb / seconds:.1f} MB/s" if mb else ""
        verdict = "ok" if (goal is None or seconds <= goal) and rss <= GOAL_RSS_MB else "over a goal"
        found = {"entries": n, "what": what, "seconds": round(seconds, 2), "rss_mb": round(rss), "speed": speed,
                 "note": note, "verdict": verdict}
        print(f"  {what}: {seconds:.2f} s, {rss:.0f} MB {speed} {note}", flush=True)
        rows.append(found)
        return found

    c = ["--cache-dir", str(cache)]
    seconds, rss, out = measure(inner("bookkeeping", str(cache), str(n)))
    book = json.loads(out)
    ratio = book["ms_at_n"] / book["ms_at_100"]
    rows.append({"entries": n, "what": "record one variant (bookkeeping)", "seconds": round(book["ms_at_n"] / 1000, 4),
                 "rss_mb": round(rss), "speed": "", "note": f"{book['ms_at_n']:.1f} ms at {n}, {book['ms_at_100']:.1f} "
                 f"ms at 100: {ratio:.2f}x", "verdict": "ok" if ratio <= 2 else "over a goal"})
    print(f"  bookkeeping: {rows[-1]['note']}", flush=True)

    def no_op(out):
        result = json.loads(out)
        assert result["compiled"] == 0 and result["cached"] == n, result
        return f"{result['cached']} cached, 0 compiled"

    row("warmup, no-op", cli("warmup", str(spec), "--target", TARGET, *c, "--json"), check=no_op)
    row(f"check (traces the spec: {made['real']} planned)", cli("check", str(spec), "--target", TARGET, *c),
        check=lambda out: next(line for line in out.splitlines() if line.startswith(TARGET))[:60])
    row(f"check, {n} planned", inner("check", str(cache), str(spec)),
        check=lambda out: "ok" if json.loads(out)["ok"] and json.loads(out)["planned"] == n else out)
    row("check --trace", cli("check", "--trace", str(work / f"record-{n}.jsonl"), "--target", TARGET, *c),
        check=lambda out: out.splitlines()[0][:60])
    row("list", cli("list", "--target", TARGET, *c), check=lambda out: f"{len(out.splitlines())} lines")
    row("du", cli("du", *c))
    row("prune --unplanned --dry-run", cli("prune", "--unplanned", "--dry-run", *c),
        check=lambda out: f"{len(out.splitlines())} lines")
    cap = bundle_cap()
    shards = max(shards, -(-n * 5 // (cap * 4)))  # a bundle holds at most `cap` entries; shards differ in size
    mb = made["bytes"] / 1e6
    whole = n <= cap
    one = [] if whole else ["--shard", f"1/{shards}"]
    label = "" if whole else f" (shard 1/{shards}: one bundle holds at most {cap:,} entries)"
    bundle = work / f"bundle-{n}.tar.gz"
    part_mb = mb if whole else mb / shards
    row(f"bundle create{label}", cli("bundle", "create", str(bundle), str(spec), "--target", TARGET, *c, *one),
        mb=part_mb, goal=None)
    row(f"bundle verify{label}", cli("bundle", "verify", str(bundle)), mb=part_mb, goal=None)
    installed = work / f"installed-{n}"
    row(f"bundle install{label}", cli("bundle", "install", str(bundle), "--cache-dir", str(installed)), mb=part_mb,
        goal=None)
    shutil.rmtree(installed)
    bundle.unlink()

    # shards: each variant exactly once; the shard bundles merged (or, past the cap, installed one by
    # one into one cache); what they make installs and checks ok
    seconds, rss, out = measure(inner("shards", str(cache), str(spec), str(shards)))
    split = json.loads(out)
    assert split["exactly_once"], split
    timings, planned_by_shards = [], 0
    for i in range(1, shards + 1):
        seconds, rss, out = measure(cli("warmup", str(spec), "--target", TARGET, *c, "--shard", f"{i}/{shards}",
                                        "--json"))
        timings.append((seconds, rss))
        planned_by_shards += json.loads(out)["planned"]
    assert planned_by_shards == n, planned_by_shards
    worst = max(timings)
    rows.append({"entries": n, "what": f"warmup --shard I/{shards}, no-op (the slowest)", "seconds": round(worst[0], 2),
                 "rss_mb": round(max(t[1] for t in timings)), "speed": "",
                 "note": f"shards cover each variant once ({min(split['shards'])}-{max(split['shards'])} each)",
                 "verdict": "ok" if worst[0] <= GOAL_SECONDS and worst[1] <= GOAL_RSS_MB else "over a goal"})
    print(f"  {rows[-1]['what']}: {worst[0]:.2f} s, {rows[-1]['note']}", flush=True)
    parts = []
    for i in range(1, shards + 1):
        parts.append(work / f"shard-{i}-{n}.tar.gz")
        measure(cli("bundle", "create", str(parts[-1]), str(spec), "--target", TARGET, *c, "--shard", f"{i}/{shards}"))
    installed = work / f"merged-installed-{n}"
    if whole:
        merged = work / f"merged-{n}.tar.gz"
        row(f"bundle merge of {shards} shards", cli("bundle", "merge", str(merged), *map(str, parts)), mb=mb,
            goal=None, check=lambda out: "merged")
        measure(cli("bundle", "install", str(merged), "--cache-dir", str(installed)))
        merged.unlink()
    else:
        start, peak = time.perf_counter(), 0.0
        for part in parts:
            peak = max(peak, measure(cli("bundle", "install", str(part), "--cache-dir", str(installed)))[1])
        seconds = time.perf_counter() - start
        rows.append({"entries": n, "what": f"bundle install of the {shards} shard bundles, one by one",
                     "seconds": round(seconds, 2), "rss_mb": round(peak), "speed": f"{mb / seconds:.1f} MB/s",
                     "note": f"merge refuses over {cap:,} entries", "verdict": "ok"})
        print(f"  {rows[-1]['what']}: {seconds:.2f} s", flush=True)
    seconds, rss, out = measure(inner("check", str(cache), str(spec), str(installed)))
    merged_check = json.loads(out)
    assert merged_check["ok"] and merged_check["planned"] == n, merged_check
    rows[-1]["note"] += "; installed, check of all ok"
    shutil.rmtree(installed)
    for path in parts:
        path.unlink()

    if use_redis:
        server, url = redis_server(work)
        if server is None:
            print("  no redis-server here: the check --remote rows are left out", flush=True)
        else:
            try:
                measure(cli("warmup", str(spec), "--target", TARGET, *c, "--push", url, "--json"))
                row(f"check --remote, {n} planned", inner("remote", str(cache), str(spec), url), mb=mb,
                    check=lambda out: "ok: reads and hashes every byte in Redis" if json.loads(out)["ok"]
                    and json.loads(out)["present"] == n else out)
                row(f"check --remote (traces the spec: {made['real']} planned)",
                    cli("check", str(spec), "--target", TARGET, "--remote", url))
            finally:
                server.terminate()
                server.wait()
    shutil.rmtree(cache)
    return rows


def start_up(work: Path, spec: Path, seed_cache: Path) -> list[dict]:
    """``tritonwarm --version`` and a no-op ``check`` against a bare ``import triton``, best of three."""
    rows = []
    real = len(json.loads((seed_cache / "tritonwarm" / f"manifest-{TARGET}.json").read_text())["variants"])
    for what, command in [("python -c 'import triton'", [sys.executable, "-c", "import triton"]),
                          ("tritonwarm --version", cli("--version")),
                          ("check of the warmed spec", cli("check", str(spec), "--target", TARGET,
                                                                        "--cache-dir", str(seed_cache)))]:
        seconds, rss = min((m[0], m[1]) for m in (measure(command) for _ in range(3)))
        rows.append({"entries": real, "what": what, "seconds": round(seconds, 2), "rss_mb": round(rss), "speed": "",
                     "note": "", "verdict": ""})
    return rows


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--inner":
        INNER[sys.argv[2]](*sys.argv[3:])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1000,5000,25000", help="cache sizes, in entries")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--no-redis", action="store_true", help="leave out check --remote")
    p.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    with tempfile.TemporaryDirectory(prefix="tritonwarm-scale-") as tmp:
        work = Path(tmp)
        os.environ["TRITON_CACHE_DIR"] = str(work / "triton-cache")  # nothing of the user's is read or written
        spec, seed_cache = seed(work)
        print("every entry beyond the spec's real ones is a copy of one of them under a new cache hash (see --help)",
              flush=True)
        rows = start_up(work, spec, seed_cache)
        for n in sizes:
            rows += at_size(work, spec, seed_cache, n, args.shards, not args.no_redis)
    command = f"python bench/scale.py --sizes {args.sizes}"
    table(f"Every command at scale ({TARGET}; clones of the real entries of one spec; goals: <= {GOAL_SECONDS:.0f} s "
          f"for each read-only command and a no-op warm-up, <= {GOAL_RSS_MB:.0f} MB peak RSS, bookkeeping "
          "<= 2x its cost at 100)",
          ["entries", "what", "seconds", "peak RSS", "speed", "note", "goals"],
          [[f"{r['entries']:,}", r["what"], f"{r['seconds']:.2f}", f"{r['rss_mb']} MB", r["speed"], r["note"],
            r["verdict"]] for r in rows], command)
    save_json(args.json, rows)


if __name__ == "__main__":
    main()
