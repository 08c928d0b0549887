"""One launcher per kernel: shapes and dtypes in, launch spec out. No device code here."""

from .rms_norm import rms_norm

__all__ = ["rms_norm"]
