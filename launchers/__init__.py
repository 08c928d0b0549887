"""One launcher per kernel: shapes and dtypes in, launch spec out. No device code here.

Importing this package also registers each launcher as a PyTorch custom op (``torch.ops.tritonwarm``).
"""

from .activation import silu_and_mul
from .fp4 import mxfp4_dequantize, mxfp4_quantize, nvfp4_dequantize, nvfp4_quantize
from .moe_align import moe_align_block_size
from .moe_routing import moe_topk_routing
from .rms_norm import rms_norm
from .rotary import rotary_embedding

__all__ = [
    "moe_align_block_size", "moe_topk_routing", "mxfp4_dequantize", "mxfp4_quantize", "nvfp4_dequantize",
    "nvfp4_quantize", "rms_norm", "rotary_embedding", "silu_and_mul",
]
