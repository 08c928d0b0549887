"""Rotary position embedding (RoPE) device code, applied in place to q and k, and its PyTorch reference."""

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(x_ptr, head_stride, n_heads, first_head, cos, sin, pair_mask, rot_half,
                  IS_NEOX: tl.constexpr, HEAD_BLOCK: tl.constexpr, HALF_BLOCK: tl.constexpr):
    """Rotate HEAD_BLOCK heads of one token of one tensor, starting at ``first_head``."""
    heads = first_head + tl.arange(0, HEAD_BLOCK)
    pairs = tl.arange(0, HALF_BLOCK)
    heads_mask = (heads < n_heads)[:, None]
    head_starts = x_ptr + heads[:, None] * head_stride
    out_ty = x_ptr.dtype.element_ty
    if IS_NEOX:  # rotate the two halves (x[i], x[i + rot/2]): two contiguous loads
        first = head_starts + pairs[None, :]
        second = first + rot_half
        mask = heads_mask & pair_mask[None, :]
        x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(second, mask=mask, other=0.0).to(tl.float32)
        tl.store(first, (x1 * cos - x2 * sin).to(out_ty), mask=mask)
        tl.store(second, (x2 * cos + x1 * sin).to(out_ty), mask=mask)
    else:  # gpt-j: rotate interleaved pairs (x[2i], x[2i + 1]): one contiguous load, split in registers
        dims = tl.arange(0, 2 * HALF_BLOCK)
        ptrs = head_starts + dims[None, :]
        mask = heads_mask & (dims < 2 * rot_half)[None, :]
        x = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        x1, x2 = tl.split(tl.reshape(x, (HEAD_BLOCK, HALF_BLOCK, 2)))
        rotated = tl.join(x1 * cos - x2 * sin, x2 * cos + x1 * sin)
        tl.store(ptrs, tl.reshape(rotated, (HEAD_BLOCK, 2 * HALF_BLOCK)).to(out_ty), mask=mask)


@triton.jit
def rotary_embedding_kernel(
    positions_ptr, q_ptr, k_ptr, cos_sin_ptr,
    q_token_stride, q_head_stride, k_token_stride, k_head_stride, cos_sin_stride,
    num_heads, num_kv_heads, rot_half,
    IS_NEOX: tl.constexpr, HEAD_BLOCK: tl.constexpr, HALF_BLOCK: tl.constexpr,
):
    # Grid: (tokens, head blocks of q followed by head blocks of k): one launch rotates both. Each
    # program takes one tensor in a *scalar* branch, so the tile's pointers keep the alignment and
    # contiguity Triton needs to vectorize the loads (a per-element select would lose both), and each
    # pointer stays derived from one kernel argument (a select between q_ptr and k_ptr crashes Triton
    # 3.6's AMD buffer-ops pass, which pointers into storages of at most 2 GiB go through).
    token = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    q_blocks = tl.cdiv(num_heads, HEAD_BLOCK)
    pairs = tl.arange(0, HALF_BLOCK)
    pair_mask = pairs < rot_half

    position = tl.load(positions_ptr + token)
    cos_sin_row = cos_sin_ptr + position * cos_sin_stride
    cos = tl.load(cos_sin_row + pairs, mask=pair_mask, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(cos_sin_row + rot_half + pairs, mask=pair_mask, other=0.0).to(tl.float32)[None, :]

    if block < q_blocks:
        _rotate_heads(q_ptr + token * q_token_stride, q_head_stride, num_heads, block * HEAD_BLOCK, cos, sin,
                      pair_mask, rot_half, IS_NEOX, HEAD_BLOCK, HALF_BLOCK)
    else:
        _rotate_heads(k_ptr + token * k_token_stride, k_head_stride, num_kv_heads, (block - q_blocks) * HEAD_BLOCK,
                      cos, sin, pair_mask, rot_half, IS_NEOX, HEAD_BLOCK, HALF_BLOCK)


def rotate_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    """Rotate the last dim of ``x`` (length rot_dim) by per-token ``cos``/``sin`` of length rot_dim/2, in fp32."""
    half = x.shape[-1] // 2
    if is_neox:
        x1, x2 = x[..., :half], x[..., half:]
    else:
        x1, x2 = x[..., 0::2], x[..., 1::2]
    out1 = x1 * cos - x2 * sin
    out2 = x2 * cos + x1 * sin
    if is_neox:
        return torch.cat([out1, out2], dim=-1)
    return torch.stack([out1, out2], dim=-1).flatten(-2)


def rotary_embedding_reference(positions, q, k, cos_sin_cache, is_neox=True):
    """Plain PyTorch; returns rotated copies of ``(q, k)`` and leaves the inputs alone.

    Only the first ``rot_dim = cos_sin_cache.shape[-1]`` dims of each head rotate; the rest are copied.
    """
    rot_dim = cos_sin_cache.shape[-1]
    cos_sin = cos_sin_cache[positions].float()  # [tokens, rot_dim]
    cos = cos_sin[:, None, : rot_dim // 2]  # broadcast over heads
    sin = cos_sin[:, None, rot_dim // 2 :]

    def apply(x):
        out = x.clone()
        out[..., :rot_dim] = rotate_reference(x[..., :rot_dim].float(), cos, sin, is_neox).to(x.dtype)
        return out

    return apply(q), apply(k)
