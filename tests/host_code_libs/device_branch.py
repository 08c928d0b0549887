"""Host code that asks its input where it lives: a block size and an SM-count-derived constexpr."""
import torch
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, NUM_SMS: tl.constexpr):
    for start in range(tl.program_id(0) * BLOCK, n, NUM_SMS * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def scale(x):
    out = torch.empty_like(x)
    block = 1024 if x.device.type == "cuda" else 128
    sm_count = torch.cuda.get_device_properties(x.device).multi_processor_count if x.device.type == "cuda" else 1
    scale_kernel[(sm_count,)](x, out, x.numel(), BLOCK=block, NUM_SMS=sm_count)
    return out
