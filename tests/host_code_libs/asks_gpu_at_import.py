"""Asks the GPU while it is imported: its capability, and a workspace allocated on ``cuda``."""
import torch
import triton
import triton.language as tl

CAPABILITY = torch.cuda.get_device_capability()
WORKSPACE = torch.zeros(64, dtype=torch.int32, device="cuda")


@triton.jit
def count_kernel(x_ptr, counter_ptr, n, NEW_GPU: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0)
    if NEW_GPU:
        x = x * 2
    tl.atomic_add(counter_ptr, tl.sum(x, axis=0))


def count(x):
    count_kernel[(triton.cdiv(x.numel(), 128),)](x, WORKSPACE, x.numel(), NEW_GPU=CAPABILITY[0] >= 9, BLOCK=128)
    return WORKSPACE[0]
