"""Two do-nothing-much kernels for the dispatch benchmark: 5 and 20 arguments."""

import triton
import triton.language as tl


@triton.jit
def args5_kernel(x_ptr, y_ptr, n, stride, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs * stride, tl.load(x_ptr + offs * stride, mask=mask) * scale, mask=mask)


@triton.jit
def args20_kernel(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, f_ptr, n, s0, s1, s2, s3, s4, s5, s6, s7, s8, alpha, beta,
                  gamma, delta, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.load(a_ptr + offs * s0, mask=mask) * alpha + tl.load(b_ptr + offs * s1, mask=mask) * beta
    acc += tl.load(c_ptr + offs * s2, mask=mask) * gamma + tl.load(d_ptr + offs * s3, mask=mask) * delta
    acc += tl.load(e_ptr + offs * s4, mask=mask) + (s5 + s6 + s7 + s8)
    tl.store(f_ptr + offs, acc, mask=mask)
