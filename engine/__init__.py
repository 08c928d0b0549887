"""The serving engine built on the kernels and launchers."""
