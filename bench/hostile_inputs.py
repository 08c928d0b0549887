"""Peak memory and time of ``tritonwarm bundle verify`` on hostile archives, against a normal bundle.

Each archive is built here: header bombs (a pax extended header and a GNU long name announcing
1 GiB, about 5 MB compressed), a header announcing 50,000 files, a bundle of 16,000 real tiny files
(at the cap), a member announcing more than the member cap, a 512 MiB member of zeros, JSON headers
at their caps and over them. Each verify runs in its own process; its peak
resident memory is read from the kernel (``wait4``). The goal: under 512 MiB on any input.

    python bench/hostile_inputs.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _common import table  # noqa: E402

SPEC = """
kernel: tritonwarm.launchers.rms_norm:rms_norm
axes:
  num_tokens: [16]
args:
  x: {tensor: [$num_tokens, 4096], dtype: bfloat16}
  weight: {tensor: [4096], dtype: bfloat16}
  eps: 1.0e-6
"""
GiB = 1 << 30


class _Gzip:
    """A gzip file written chunk by chunk at level 1 (a 1 GiB run of one byte costs ~1 MB and seconds)."""

    def __init__(self, path: Path):
        self.f = open(path, "wb")
        self.z = zlib.compressobj(1, zlib.DEFLATED, 31)

    def write(self, data: bytes) -> None:
        self.f.write(self.z.compress(data))

    def repeat(self, byte: bytes, count: int) -> None:
        chunk = byte * (1 << 24)
        while count:
            n = min(count, len(chunk))
            self.write(chunk[:n])
            count -= n

    def close(self) -> None:
        self.f.write(self.z.flush())
        self.f.close()


def _header_block(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name[:99])
    info.size, info.type, info.mode = size, kind, 0o644
    return info.tobuf(tarfile.USTAR_FORMAT)


def _members(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]


def _write(path: Path, members, tail=None) -> Path:
    gz = _Gzip(path)
    for name, data in members:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o644
        gz.write(info.tobuf(tarfile.PAX_FORMAT) + data + b"\0" * (-len(data) % 512))
    if tail is not None:
        tail(gz)
    gz.write(b"\0" * 1024)
    gz.close()
    return path


def _extended_bomb(gz: _Gzip, kind: bytes, entry: str) -> None:
    """A pax (``x``) or GNU long-name (``L``) header announcing 1 GiB, then its 1 GiB of data."""
    size = GiB
    if kind == b"x":  # one pax record: "<len> path=<entry>/aaaa…\n"
        body = size - len(f"{size} path={entry}/\n")
        gz.write(_header_block("././@PaxHeader", size, b"x") + f"{size} path={entry}/".encode())
        gz.repeat(b"a", body)
        gz.write(b"\n")
    else:
        gz.write(_header_block("././@LongLink", size, b"L") + f"{entry}/".encode())
        gz.repeat(b"b", size - len(entry) - 1)
    gz.write(b"\0" * (-size % 512) + _header_block(f"{entry}/x", 0))


def _huge_member(gz: _Gzip, name: str, size: int) -> None:
    gz.write(_header_block(name, size))
    gz.repeat(b"\0", size)
    gz.write(b"\0" * (-size % 512))


def _entry(i: int, row: dict, names: int) -> tuple[str, dict, list[tuple[str, bytes]]]:
    cache_hash = hashlib.sha256(f"entry {i}".encode()).hexdigest()
    entry_dir = base64.b32encode(bytes.fromhex(cache_hash)).decode().rstrip("=")
    metadata_name = f"{row['entry_name']}.json"
    files = {metadata_name: json.dumps({"name": row["entry_name"], "hash": cache_hash}).encode()}
    files.update({f"{row['entry_name']}.f{j}": f"{i}.{j}".encode() for j in range(names - 1)})
    digests = {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}
    group = json.dumps({"child_paths": {n: f"{entry_dir}/{n}" for n in sorted(files)}}, sort_keys=True).encode()
    members = [(f"{entry_dir}/{n}", files[n]) for n in sorted(files)]
    members.append((f"{entry_dir}/__grp__{row['entry_name']}.json", group))
    return cache_hash, {**row, "cache_hash": cache_hash, "entry_dir": entry_dir, "id": cache_hash[:12],
                        "files": digests}, members


def build(folder: Path) -> dict[str, Path]:
    """Every archive of the table, from one real bundle warmed here."""
    from tritonwarm.cli import main

    (folder / "rms.yaml").write_text(SPEC)
    normal = folder / "normal.tar.gz"
    assert main(["warmup", str(folder / "rms.yaml"), "--target", "sm90", "--cache-dir", str(folder / "cache")]) == 0
    assert main(["bundle", "create", str(normal), str(folder / "rms.yaml"), "--target", "sm90",
                 "--cache-dir", str(folder / "cache")]) == 0
    good = _members(normal)
    header = json.loads(good[0][1])
    [(_, row)] = header["targets"]["sm90"].items()
    entry = good[1][0].split("/")[0]
    out = {"normal bundle (1 entry)": normal}
    out["pax header bomb (1 GiB path)"] = _write(folder / "pax.tar.gz", good,
                                                 lambda gz: _extended_bomb(gz, b"x", entry))
    out["GNU long name bomb (1 GiB)"] = _write(folder / "gnu.tar.gz", good, lambda gz: _extended_bomb(gz, b"L", entry))

    def with_rows(count: int, names: int):
        rows, members = {}, []
        for i in range(count):
            cache_hash, new_row, new_members = _entry(i, row, names)
            rows[cache_hash] = new_row
            members += new_members
        return {**header, "targets": {"sm90": rows}}, members

    many, _ = with_rows(2000, 25)
    out["header announcing 50,000 files"] = _write(folder / "many.tar.gz",
                                                   [("tritonwarm-bundle.json", json.dumps(many).encode())])
    real, members = with_rows(1600, 10)
    out["16,000 real tiny files (at the cap)"] = _write(
        folder / "tiny.tar.gz", [("tritonwarm-bundle.json", json.dumps(real).encode()), *members])
    cubin = next(n for n, _ in good if n.endswith(".cubin"))
    rest = [(n, d) for n, d in good if n != cubin]
    out["member announcing 1 GiB + 1"] = _write(folder / "over.tar.gz", rest,
                                                lambda gz: _huge_member(gz, cubin, GiB + 1))
    out["512 MiB member of zeros"] = _write(folder / "zeros.tar.gz", rest,
                                            lambda gz: _huge_member(gz, cubin, 512 << 20))
    fat = {**header, "targets": {"sm90": {h: {**r, "args": {f"a{i}": "xy" for i in range(599_000)}}
                                          for h, r in header["targets"]["sm90"].items()}}}
    out["header of 1,198,000 strings (at the caps)"] = _write(folder / "fat.tar.gz",
                                                            [(good[0][0], json.dumps(fat).encode()), *good[1:]])
    out["16 MiB header of '[],' (parses to 400 MiB)"] = _write(
        folder / "lists.tar.gz", [(good[0][0], b'{"format": 1, "x": [' + b"[]," * (5 << 20) + b"0]}")])
    return out


def measure(path: Path) -> tuple[float, float, int, str]:
    """``(peak MiB, seconds, exit code, first line of stderr)`` of one ``tritonwarm bundle verify``."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "tritonwarm", "bundle", "verify", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    line = next((x for x in err.splitlines() if x.startswith("tritonwarm:")), "").replace(f"{path}: ", "")
    return usage.ru_maxrss / 1024, seconds, proc.returncode, line


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keep", metavar="DIR", help="build the archives in DIR and leave them there")
    p.add_argument("--build-into", metavar="DIR", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.build_into:  # in a child: a forked child's peak memory counts its parent's pages before exec
        print(json.dumps({label: str(path) for label, path in build(Path(args.build_into)).items()}))
        return
    folder = Path(args.keep or tempfile.mkdtemp(prefix="tritonwarm-hostile-"))
    folder.mkdir(parents=True, exist_ok=True)
    built = subprocess.run([sys.executable, __file__, "--build-into", str(folder)], capture_output=True, text=True,
                           check=True)
    archives = {label: Path(path) for label, path in json.loads(built.stdout.splitlines()[-1]).items()}
    rows, baseline = [], None
    for label, path in archives.items():
        peak, seconds, code, line = measure(path)
        baseline = baseline or peak
        rows.append((label, f"{path.stat().st_size / 1e6:.2f}", f"{peak:.0f}", f"{peak / baseline:.2f}",
                     f"{seconds:.1f}", str(code), line[len("tritonwarm: error: "):][:90] or "ok"))
    table("Peak resident memory of `tritonwarm bundle verify` (its own process) per archive",
          ["archive", "MB", "peak MiB", "x normal", "s", "exit", "says"], rows, "python bench/hostile_inputs.py")
    worst = max(float(r[2]) for r in rows)
    print(f"\nworst peak: {worst:.0f} MiB ({'under' if worst < 512 else 'OVER'} the 512 MiB goal)")
    if not args.keep:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
