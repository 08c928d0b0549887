"""Registers at import, as vLLM does (``vllm.utils.torch_utils``): an opaque type and a torch custom
op. A second import in one process is refused ("Type '...LayerName' is already registered as an
opaque type"), so a warm-up may import it once per target and process, never again."""

import torch
from torch._library.opaque_object import register_opaque_type


class LayerName(torch._opaque_base.OpaqueBase):
    def __init__(self, name: str):
        self.name = name


register_opaque_type(LayerName, typ="reference")
torch.library.define(f"{__name__}::identity", "(Tensor x) -> Tensor")  # each copy of the package its own
