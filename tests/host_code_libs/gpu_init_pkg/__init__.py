"""A package whose ``__init__`` asks the GPU: loading a spec that names a module inside it must not run it."""
import torch

ARCH = torch.cuda.get_device_capability()
