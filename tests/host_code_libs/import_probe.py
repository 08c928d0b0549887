"""Probes the platform at import: the autotune config list and a constexpr global follow the answer."""
import torch
import triton
import triton.language as tl
from triton.runtime import driver


def _backend():
    try:
        return driver.active.get_current_target().backend
    except Exception:  # no GPU driver here
        return "cpu"


IS_HIP = tl.constexpr(_backend() == "hip")
if torch.cuda.is_available():
    CONFIGS = [triton.Config({"BLOCK": 256}, num_warps=8 if IS_HIP else 4),
               triton.Config({"BLOCK": 512}, num_warps=8)]
else:
    CONFIGS = [triton.Config({"BLOCK": 64}, num_warps=1)]


@triton.autotune(configs=CONFIGS, key=["n"], cache_results=True)
@triton.jit
def add_one_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    if IS_HIP:
        x = x + 1
    tl.store(x_ptr + offs, x + 1, mask=offs < n)


def add_one(x):
    n = x.numel()
    add_one_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, n)
    return x
