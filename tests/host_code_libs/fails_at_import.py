"""A library whose import fails for a reason of its own, whatever the machine answers."""
import torch

if torch.cuda.get_device_capability() < (10, 0):
    raise RuntimeError("this build needs a Blackwell GPU")


def launch(x):
    return x
