"""Test fixtures: a GEMM whose tile is a launch argument, so a spec row can ask for one over a target's
shared memory (six stages of 64x128 and 128x128 fp16 tiles need about 288 KB on sm90, which allows
227 KB per block), and the same GEMM under ``@triton.autotune`` with one config that fits and one that
does not (Triton's autotuner skips that one at run time)."""

import triton
import triton.language as tl
from tritonwarm.jit import JitKernel, Launch


@triton.jit
def _gemm(a_ptr, b_ptr, c_ptr, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    m = tl.arange(0, BLOCK_M)
    n = tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for start in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + m[:, None] * K + (start + k)[None, :])
        b = tl.load(b_ptr + (start + k)[:, None] * BLOCK_N + n[None, :])
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + m[:, None] * BLOCK_N + n[None, :], acc.to(c_ptr.dtype.element_ty))


@triton.jit
def tile_gemm_kernel(a_ptr, b_ptr, c_ptr, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    _gemm(a_ptr, b_ptr, c_ptr, K, BLOCK_M, BLOCK_N, BLOCK_K)


def tile_gemm_launch(a, b, c, block_k: int = 128, num_stages: int = 2) -> Launch:
    block_m, block_n = c.shape
    return Launch(grid=(1,), args=(a, b, c, a.shape[1]), constexprs=dict(BLOCK_M=block_m, BLOCK_N=block_n,
                                                                         BLOCK_K=block_k),
                  num_warps=4, num_stages=num_stages)


tile_gemm = JitKernel(tile_gemm_kernel, tile_gemm_launch)


@triton.autotune(configs=[triton.Config({"BLOCK_K": 32}, num_warps=4, num_stages=2),
                          triton.Config({"BLOCK_K": 128}, num_warps=4, num_stages=6)], key=["K"], cache_results=True)
@triton.jit
def tuned_gemm_kernel(a_ptr, b_ptr, c_ptr, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    _gemm(a_ptr, b_ptr, c_ptr, K, BLOCK_M, BLOCK_N, BLOCK_K)


def tuned_gemm_launch(a, b, c) -> Launch:
    block_m, block_n = c.shape
    return Launch(grid=(1,), args=(a, b, c, a.shape[1]), constexprs=dict(BLOCK_M=block_m, BLOCK_N=block_n))


tuned_gemm = JitKernel(tuned_gemm_kernel, tuned_gemm_launch)


def gemm_directly(a, b, c, num_stages: int):
    """The GEMM as another library launches it (``kernel[grid](...)``, no JitKernel): warmed by a spec
    with ``capture: all``."""
    block_m, block_n = c.shape
    tile_gemm_kernel[(1,)](a, b, c, a.shape[1], BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=128, num_warps=4,
                           num_stages=num_stages)
