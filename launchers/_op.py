"""``torch.ops.tritonwarm.*``: each launcher registered through the plain ``torch.library.Library``
path, which costs a fraction of ``torch.library.custom_op``'s per-call Python (that wrapper adds
an autograd layer and argument re-binding on every call; these ops are inference-only). The
schema is inferred from the type hints exactly as ``custom_op`` infers it, and the same
``register_fake`` makes each op traceable by ``torch.compile``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

NAMESPACE = "tritonwarm"
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")


class Op:
    """The registered op: callable as the plain function; ``register_fake`` as on a ``custom_op``."""

    def __init__(self, name: str, fn: Callable):
        self.name, self.fn = name, fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def register_fake(self, fake: Callable) -> Callable:
        torch.library.register_fake(f"{NAMESPACE}::{self.name}", fake, lib=_LIBRARY)
        return fake


def custom_op(qualname: str, mutates_args: tuple[str, ...] | tuple = ()):
    """Define ``qualname`` (``tritonwarm::name``) with the decorated function as its one kernel for
    every device (``CompositeExplicitAutograd``: the launcher itself picks GPU or interpreter)."""
    namespace, name = qualname.split("::")
    if namespace != NAMESPACE:
        raise ValueError(f"{qualname}: ops live in the {NAMESPACE} namespace")

    def register(fn: Callable) -> Op:
        schema = torch.library.infer_schema(fn, mutates_args=mutates_args)
        _LIBRARY.define(name + schema)
        _LIBRARY.impl(name, fn, "CompositeExplicitAutograd")
        return Op(name, fn)

    return register
