"""One launcher per kernel: shapes and dtypes in, launch spec out. No device code here.

Importing this package also registers each launcher as a PyTorch custom op (``torch.ops.tritonwarm``).
"""

from .activation import silu_and_mul
from .fp4 import mxfp4_dequantize, mxfp4_quantize, nvfp4_dequantize, nvfp4_quantize
from .fused_moe import fused_moe, fused_moe_mxfp4, fused_moe_nvfp4
from .kv_block_zero import kv_block_zero
from .kv_cache import KVCacheLayout
from .kv_cache_formats import QUANTIZED_DS_MLA_FORMATS, QuantizedMLALayout, kv_format
from .mla_kv_quant import mla_kv_cache_write, quantized_mla_decode_attention, quantized_mla_decode_metadata
from .mla_metadata import mla_decode_metadata
from .moe_align import moe_align_block_size
from .moe_routing import moe_topk_routing
from .paged_attention import paged_decode_attention, paged_decode_metadata
from .rms_norm import rms_norm
from .rotary import rotary_embedding

__all__ = [
    "KVCacheLayout", "QUANTIZED_DS_MLA_FORMATS", "QuantizedMLALayout", "fused_moe", "fused_moe_mxfp4",
    "fused_moe_nvfp4", "kv_block_zero", "kv_format", "mla_decode_metadata", "mla_kv_cache_write",
    "moe_align_block_size", "moe_topk_routing", "mxfp4_dequantize", "mxfp4_quantize", "nvfp4_dequantize",
    "nvfp4_quantize", "paged_decode_attention", "paged_decode_metadata", "quantized_mla_decode_attention",
    "quantized_mla_decode_metadata", "rms_norm", "rotary_embedding", "silu_and_mul",
]
