"""A library's training op as Liger-Kernel writes them: a ``torch.autograd.Function`` whose forward
launches the variant with ``HAS_GRAD = x.requires_grad`` (it keeps what the backward needs), and
whose backward sizes its grid by the SM count when the gradient lives on ``cuda`` (one program
elsewhere) and allocates beside the gradient."""

import torch
import triton
import triton.language as tl


@triton.jit
def scale_forward(x_ptr, y_ptr, saved_ptr, n, HAS_GRAD: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, x * 2.0, mask=offs < n)
    if HAS_GRAD:
        tl.store(saved_ptr + offs, x, mask=offs < n)


@triton.jit
def scale_backward(dy_ptr, dx_ptr, n, per_program, BLOCK: tl.constexpr):
    for i in range(per_program):
        offs = (tl.program_id(0) * per_program + i) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dx_ptr + offs, tl.load(dy_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.empty_like(x)
        saved = torch.empty_like(x) if x.requires_grad else y
        scale_forward[(triton.cdiv(x.numel(), 128),)](x, y, saved, x.numel(), HAS_GRAD=x.requires_grad, BLOCK=128)
        return y

    @staticmethod
    def backward(ctx, dy):
        sms = torch.cuda.get_device_properties(dy.device).multi_processor_count if dy.device.type == "cuda" else 1
        dx = torch.empty(dy.shape, dtype=dy.dtype, device=dy.device)
        scale_backward[(sms,)](dy, dx, dy.numel(), triton.cdiv(triton.cdiv(dy.numel(), 128), sms), BLOCK=128)
        return dx


def train_step(x):
    """Forward; and backward when ``x`` requires grad (a training step), as a training loop calls it."""
    y = Scale.apply(x)
    if x.requires_grad:
        (y * 3.0).sum().backward()
        assert x.grad is not None and x.grad.shape == x.shape
    return y
