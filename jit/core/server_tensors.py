"""Tensors that look, to host code, like the server's GPU tensors, on a machine without that GPU.

A library's wrapper asks its inputs where they live (``x.device.type == "cuda"``, ``x.is_cuda``,
``x.device.index``) and allocates outputs beside them (``torch.empty_like(x)``,
``torch.empty(n, device=x.device)``). On meta tensors it takes the CPU branch and warms keys the
server never asks for. A ``ServerTensor`` is a plain tensor (meta while warming, a real CPU tensor
where values are needed or a test plays the server) that answers ``cuda`` to those questions, for
NVIDIA and HIP targets alike (a ROCm torch reports ``cuda`` too). What Triton reads of it is what
it reads of the server's tensor: sizes, strides, dtype, storage size (HIP's pointer-range class) and
the data pointer's alignment class (a meta tensor's address is its storage offset in bytes, as the
same view has on the 256-byte aligned caching allocator; a CPU tensor's is its own).

Inside ``server_tensors(backing)`` every allocation asked for on ``cuda`` is made on ``backing``
instead (``meta`` while warming, ``cpu`` for a test that plays the server) and comes back as a
``ServerTensor``; operations on ``ServerTensor`` s give ``ServerTensor`` s. Host code that reads a
meta tensor's values (``.item()``, ``.tolist()``, ``nonzero()``, ``if t:``) fails with
``DataDependentError`` naming the user's file and line and the spec field that provides them.

``server_tensors("meta", meta_as_cuda=True)`` (a dry-run ``record``) also takes the program's own
``meta`` tensors for the server's: a program run with ``--device meta`` stands them in for its GPU,
so its libraries' wrappers must see ``cuda`` there too.
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

_DEVICE = torch.device("cuda", 0)
_PLAIN = torch.Tensor


class DataDependentError(RuntimeError):
    """Host code read the values of a tensor warm-up only fakes."""


class ServerTensor(torch.Tensor):
    """A meta or CPU tensor that host code sees as ``cuda:0``; ``arg``: the spec argument it stands for."""

    arg: str | None = None

    @staticmethod
    def __new__(cls, base: torch.Tensor, arg: str | None = None):
        tensor = _PLAIN._make_subclass(cls, base.as_subclass(_PLAIN) if isinstance(base, cls) else base)
        tensor.arg = arg
        return tensor

    @property
    def device(self) -> torch.device:
        return _DEVICE

    @property
    def is_cuda(self) -> bool:
        return True

    @property
    def is_cpu(self) -> bool:
        return False

    @property
    def is_meta(self) -> bool:
        return False

    def get_device(self) -> int:
        return 0

    def data_ptr(self) -> int:
        plain = self.as_subclass(_PLAIN)
        if plain.is_meta:  # the address the same view has on the server's (aligned) allocator
            return plain.storage_offset() * plain.element_size()
        return plain.data_ptr()

    def __repr__(self, *args, **kwargs) -> str:
        plain = self.as_subclass(_PLAIN)
        return f"ServerTensor({tuple(plain.shape)}, {plain.dtype}, on {plain.device.type} as cuda:0)"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {}, None)


def backing_device(value: torch.Tensor) -> torch.device:
    """Where a tensor really is (a ``ServerTensor`` says ``cuda``)."""
    return value.as_subclass(_PLAIN).device if isinstance(value, ServerTensor) else value.device


def plain(value):
    """A ``ServerTensor`` as the plain meta / CPU tensor it is (anything else unchanged)."""
    return value.as_subclass(_PLAIN) if isinstance(value, ServerTensor) else value


def as_server_tensor(value, arg: str | None = None):
    """Meta and CPU tensors (in lists, tuples and dicts) as ``ServerTensor`` s; anything else unchanged."""
    if isinstance(value, ServerTensor):
        return value
    if isinstance(value, torch.Tensor):
        return ServerTensor(value, arg)
    if isinstance(value, (list, tuple)):
        return type(value)(as_server_tensor(v, arg) for v in value)
    if isinstance(value, dict):
        return {k: as_server_tensor(v, arg) for k, v in value.items()}
    return value


class _ServerTensorMode(TorchFunctionMode):
    def __init__(self, backing: str, meta_as_cuda: bool):
        super().__init__()
        self.backing = torch.device(backing)
        self.meta_as_cuda = meta_as_cuda

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {}, self.backing, self.meta_as_cuda)


@contextlib.contextmanager
def server_tensors(backing: str = "meta", meta_as_cuda: bool = False):
    """Inside the block, tensors host code allocates on ``cuda`` are ``ServerTensor`` s on ``backing``;
    ``meta_as_cuda``: ``meta`` tensors too (a program that stands them in for its GPU)."""
    with _ServerTensorMode(backing, meta_as_cuda and torch.device(backing).type == "meta"):
        yield


_DATA_READS = {
    _PLAIN.item: ".item()", _PLAIN.tolist: ".tolist()", _PLAIN.nonzero: ".nonzero()", torch.nonzero: "torch.nonzero",
    _PLAIN.__bool__: "a truth test (if t:)", _PLAIN.__int__: "int(t)", _PLAIN.__index__: "using a tensor as an index",
    _PLAIN.__float__: "float(t)", _PLAIN.numpy: ".numpy()", torch.unique: "torch.unique",
    _PLAIN.unique: ".unique()", torch.masked_select: "torch.masked_select", torch.bincount: "torch.bincount",
    _PLAIN.bincount: ".bincount()", torch.repeat_interleave: "torch.repeat_interleave",
}
_TO_HOST = {_PLAIN.cpu, _PLAIN.numpy}


def _is_cuda(device, meta_as_cuda: bool = False) -> bool:
    types = ("cuda", "meta") if meta_as_cuda else ("cuda",)
    if isinstance(device, torch.device):
        return device.type in types
    if isinstance(device, str):
        return device.split(":")[0] in types
    return isinstance(device, int) and not isinstance(device, bool)


def _dispatch(func, args, kwargs, backing: torch.device | None, meta_as_cuda: bool = False):
    """Run ``func`` on the plain tensors, allocate ``cuda`` on the backing device, dress the results
    (``meta_as_cuda``: plain ``meta`` tensors count as the server's too)."""
    if meta_as_cuda:
        args, kwargs = tree_map(_dressed_meta, (args, kwargs))
    server = [a for a in _leaves((args, kwargs)) if isinstance(a, ServerTensor)]
    fakes = any(backing_device(s).type == "meta" for s in server)
    if fakes:
        backing = torch.device("meta")
        if func in _DATA_READS:
            raise _data_error(_DATA_READS[func], server)
    elif server:
        backing = backing_device(server[0])
    elif backing is None:
        backing = torch.device("meta")
    if func is _PLAIN.cuda:
        return args[0] if isinstance(args[0], ServerTensor) else ServerTensor(args[0].to(backing))
    to_cuda = to_host = False
    if "device" in kwargs and kwargs["device"] is not None:
        to_cuda = _is_cuda(kwargs["device"], meta_as_cuda)
        to_host = not to_cuda
        if to_cuda:
            kwargs = {**kwargs, "device": backing}
    if func is _PLAIN.to and len(args) > 1 and _is_device(args[1]):
        to_cuda = _is_cuda(args[1], meta_as_cuda)
        to_host = not to_cuda
        if to_cuda:
            args = (args[0], backing, *args[2:])
    plain_args, plain_kwargs = tree_map(lambda v: _unwrap(v, fakes), (args, kwargs))
    try:
        with torch._C.DisableTorchFunctionSubclass():
            result = func(*plain_args, **plain_kwargs)
    except (NotImplementedError, RuntimeError) as e:
        if fakes and "meta" in str(e).lower():
            raise _data_error(getattr(func, "__name__", str(func)), server) from None
        raise
    if to_host or func in _TO_HOST or not (server or to_cuda):
        return result
    arg = next((s.arg for s in server if s.arg), None)
    return tree_map(lambda v: ServerTensor(v, arg) if type(v) is _PLAIN and v.device == backing else v, result)


def _dressed_meta(value):
    """A plain ``meta`` tensor as a ``ServerTensor`` (what a program's stand-in for its GPU is)."""
    if type(value) is _PLAIN and value.device.type == "meta":
        return ServerTensor(value)
    return value


def _is_device(value) -> bool:
    return isinstance(value, (torch.device, str)) or (isinstance(value, int) and not isinstance(value, bool))


def _unwrap(value, fakes: bool):
    if isinstance(value, ServerTensor):
        tensor = value.as_subclass(_PLAIN)
        if fakes and tensor.device.type != "meta":
            tensor = tensor.to("meta")  # a spec's real index tensor beside fakes: its values cannot matter here
        return tensor
    return value


def _leaves(tree):
    if isinstance(tree, (list, tuple)):
        for item in tree:
            yield from _leaves(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from _leaves(item)
    else:
        yield tree


def _internal(filename: str) -> bool:
    """Frames of torch, Triton, tritonwarm and the standard library (not of other installed packages)."""
    import sysconfig

    import triton

    if filename.startswith("<"):
        return True
    name = os.path.abspath(filename)
    paths = sysconfig.get_paths()
    packages = tuple(os.path.abspath(paths[k]) + os.sep for k in ("purelib", "platlib"))
    stdlib = os.path.abspath(paths["stdlib"]) + os.sep
    ours = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
    runtime = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, triton))
    return name.startswith((ours, *runtime)) or (name.startswith(stdlib) and not name.startswith(packages))


def user_frame() -> str:
    """``file:line`` of the innermost frame outside torch, Triton, tritonwarm and the standard library."""
    frame = sys._getframe(1)
    while frame is not None:
        if not _internal(frame.f_code.co_filename):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


def raised_at(error: BaseException) -> str | None:
    """``file:line`` of the innermost frame of ``error``'s traceback in the user's code, if any."""
    found, tb = None, error.__traceback__
    while tb is not None:
        if not _internal(tb.tb_frame.f_code.co_filename):
            found = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


def _data_error(what: str, server: list[ServerTensor]) -> DataDependentError:
    fake = next((s for s in server if backing_device(s).type == "meta"), server[0])
    plain_fake = fake.as_subclass(_PLAIN)
    shown = f"{list(plain_fake.shape)} {str(plain_fake.dtype).replace('torch.', '')}"
    named = f" (from {fake.arg})" if fake.arg else ""
    field = f"{fake.arg}.values" if fake.arg else "the tensor's values"
    return DataDependentError(
        f"{user_frame()}: {what} reads the values of a tensor warm-up only fakes{named}, {shown}: give them in "
        f"the spec with {field} (e.g. {{tensor: [4], dtype: int32, values: [0, 3, 5, 7]}})")
