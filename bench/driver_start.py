"""What Triton's driver start costs a serving process when the cache lacks its C utilities.

Triton's CUDA driver starts at a process's first launch and builds ``cuda_utils`` into the cache
unless it finds it there (from Triton 3.8 keyed by where ``libcuda.so.1`` is, so a cache warmed
elsewhere lacks it unless warm-up knew that place). Three fresh processes, each timed whole, in turn:

- ``import``: Python, torch and Triton's driver module imported, nothing started (the floor);
- ``warmed``: the driver's utilities started from a cache where warm-up built them (``tritonwarm
  warmup``, with ``TRITON_LIBCUDA_PATH`` naming the place);
- ``cold``: the same start on an empty cache: Triton runs the C compiler first.

No GPU is needed: ``TRITON_LIBCUDA_PATH`` names a folder holding a stub ``libcuda.so.1`` (made here,
as warm-up makes one to link against), which the utilities open when they load.

    python bench/driver_start.py [--repeat 7] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _common import save_json, table, tritonwarm  # noqa: E402

SPEC = """
kernel: tritonwarm.launchers.rms_norm:rms_norm
args:
  x: {tensor: [1, 2048], dtype: bfloat16}
  weight: {tensor: [2048], dtype: bfloat16}
"""
START = """
import sys
from triton.backends.nvidia.driver import CudaUtils
if sys.argv[1:] != ["--import-only"]:
    CudaUtils()  # what the driver does when it starts
"""


def timed(args: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", START, *args], env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()

    import triton
    from tritonwarm.jit.serving.c_launchers import machine_utilities_call, utilities_keyed_by_source, write_stub_libcuda

    with tempfile.TemporaryDirectory() as tmp:
        driver, warmed = Path(tmp, "driver"), Path(tmp, "warmed")
        driver.mkdir()
        os.environ["TRITON_LIBCUDA_PATH"] = str(driver)
        env = {**os.environ, "LD_LIBRARY_PATH": str(driver)}
        if utilities_keyed_by_source():  # 3.6, 3.7: the same build, keyed by its source alone
            source = Path(triton.__file__).parent.joinpath("backends", "nvidia", "driver.c").read_text()
        else:
            source = machine_utilities_call("cuda").source
        write_stub_libcuda(str(driver), [source])
        spec = Path(tmp, "rms_norm.yaml")
        spec.write_text(SPEC)
        tritonwarm("warmup", str(spec), "--target", "sm90", "--cache-dir", str(warmed), env=env)
        times: dict[str, list[float]] = {"import": [], "warmed": [], "cold": []}
        for i in range(args.repeat + 1):  # the first round warms the page cache and is not counted
            cold = Path(tmp, f"cold{i}")
            round_ = {"import": timed(["--import-only"], {**env, "TRITON_CACHE_DIR": str(warmed)}),
                      "warmed": timed([], {**env, "TRITON_CACHE_DIR": str(warmed)}),
                      "cold": timed([], {**env, "TRITON_CACHE_DIR": str(cold)})}
            if i:
                for name, seconds in round_.items():
                    times[name].append(seconds)
    medians = {name: statistics.median(values) for name, values in times.items()}
    rows = [[name, f"{medians[name] * 1000:.0f}", f"{(medians[name] - medians['import']) * 1000:.0f}",
             f"{medians[name] / medians['warmed']:.2f}x"] for name in ("import", "warmed", "cold")]
    table(f"Driver start, fresh process, median of {args.repeat} (Triton {triton.__version__})",
          ["process", "wall ms", "over import ms", "vs warmed"], rows, "python bench/driver_start.py")
    save_json(args.json, {"triton": triton.__version__, "repeat": args.repeat, "seconds": times})


if __name__ == "__main__":
    main()
