"""Cache size per variant: full entries (binary + IR + metadata) vs binary-only (what Triton's
runtime loads: the cubin/hsaco and its metadata).

    python bench/cache_size.py [--targets sm90,gfx942]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from _common import table, tritonwarm  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", default="sm90,gfx942")
    args = p.parse_args()
    sizes = {}
    for mode in ("full", "binary-only"):
        with tempfile.TemporaryDirectory() as cache:
            extra = ["--binary-only"] if mode == "binary-only" else []
            tritonwarm("warmup", "--target", args.targets, "--cache-dir", cache, "--json", *extra)
            _, usage = tritonwarm("du", "--cache-dir", cache, "--json")
            for row in usage["kernels"]:
                total = sizes.setdefault(row["target"], {}).setdefault(mode, [0, 0])
                total[0] += row["bytes"]
                total[1] += row["variants"]
    rows = []
    for target, modes in sorted(sizes.items()):
        (full, n), (slim, _) = modes["full"], modes["binary-only"]
        rows.append([target, n, f"{full / n / 1024:.1f}", f"{slim / n / 1024:.1f}", f"{slim / full:.2f}",
                     f"{full / 2**20:.2f}", f"{slim / 2**20:.2f}"])
    table("Cache size, shipped specs", ["target", "variants", "KiB/variant full", "KiB/variant binary-only",
                                       "ratio", "MiB full", "MiB binary-only"],
          rows, f"python bench/cache_size.py --targets {args.targets}")


if __name__ == "__main__":
    main()
