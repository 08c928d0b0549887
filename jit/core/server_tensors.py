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
``DataDependentError`` naming the user's file and line and the spec field that provides them. A
tensor whose values the call gives (``torch.tensor(1.0, device="cuda")``) is a real CPU tensor.

``server_tensors("meta", meta_as_cuda=True)`` (a dry-run ``record``) also takes the program's own
``meta`` tensors for the server's: a program run with ``--device meta`` stands them in for its GPU,
so its libraries' wrappers must see ``cuda`` there too. A program that reads a fake's values there
(``.item()``, ``.tolist()``, ``.cpu()``) stops with the program's own line, and what to do instead.

Autograd sees what it sees on the server, so a library's training branches run (``HAS_GRADIENTS =
x.requires_grad``, a ``torch.autograd.Function``'s backward): a ``ServerTensor`` keeps
``requires_grad`` and its place in the graph (a result with a ``grad_fn`` is dressed as a view of
it, a leaf as a leaf), ``requires_grad_()``, ``.grad``, ``backward()`` and ``torch.autograd.grad``
act on the tensor itself, an operation that returns one of its inputs (in-place, ``contiguous()``)
returns that very ``ServerTensor``, and the gradients autograd computes for a ``ServerTensor`` (what
a ``Function``'s backward receives, what lands in ``.grad``) are ``ServerTensor`` s too.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import inspect
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
        with torch._C.DisableTorchFunction():
            if isinstance(base, cls):
                base = base.as_subclass(_PLAIN)
            if base.grad_fn is not None:  # a result inside autograd's graph: a view of it stays there
                tensor = base.as_subclass(cls)
            else:  # a leaf: a new tensor on the same storage, with its requires_grad
                tensor = _PLAIN._make_subclass(cls, base, base.requires_grad)
        tensor.arg = arg
        _dress_gradients(tensor)
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

    def __deepcopy__(self, memo):
        """A leaf's copy (``copy.deepcopy(model)``): the same layout, ``requires_grad``, ``.grad`` and
        attributes (a ``Parameter``'s mark); autograd copies leaves only, as for plain tensors."""
        if id(self) in memo:
            return memo[id(self)]
        with torch._C.DisableTorchFunction():
            if not self.is_leaf:
                return _PLAIN.__deepcopy__(self.as_subclass(_PLAIN), memo)  # torch's own refusal
            copied = copy.deepcopy(self.detach(), memo).requires_grad_(self.requires_grad)
        tensor = ServerTensor(copied, self.arg)
        memo[id(self)] = tensor
        tensor.__dict__.update(copy.deepcopy({k: v for k, v in self.__dict__.items() if k != "arg"}, memo))
        if self.grad is not None:
            with torch._C.DisableTorchFunction():
                tensor.grad = copy.deepcopy(self.grad, memo)
        return tensor

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
        return _dispatch(func, args, kwargs or {}, self.backing, self.meta_as_cuda, self)


_dry_run = contextvars.ContextVar("tritonwarm_dry_run_of_a_program", default=False)


@contextlib.contextmanager
def server_tensors(backing: str = "meta", meta_as_cuda: bool = False):
    """Inside the block, tensors host code allocates on ``cuda`` are ``ServerTensor`` s on ``backing``;
    ``meta_as_cuda``: ``meta`` tensors too (a program that stands them in for its GPU: a dry run)."""
    meta_as_cuda = meta_as_cuda and torch.device(backing).type == "meta"
    token = _dry_run.set(meta_as_cuda)
    try:
        with _ServerTensorMode(backing, meta_as_cuda):
            yield
    finally:
        _dry_run.reset(token)


_DATA_READS = {
    _PLAIN.item: ".item()", _PLAIN.tolist: ".tolist()", _PLAIN.nonzero: ".nonzero()", torch.nonzero: "torch.nonzero",
    _PLAIN.__bool__: "a truth test (if t:)", _PLAIN.__int__: "int(t)", _PLAIN.__index__: "using a tensor as an index",
    _PLAIN.__float__: "float(t)", _PLAIN.numpy: ".numpy()", torch.unique: "torch.unique",
    _PLAIN.unique: ".unique()", torch.masked_select: "torch.masked_select", torch.bincount: "torch.bincount",
    _PLAIN.bincount: ".bincount()", torch.repeat_interleave: "torch.repeat_interleave", _PLAIN.cpu: ".cpu()",
    torch.equal: "torch.equal", _PLAIN.equal: ".equal()",
}
_TO_HOST = {_PLAIN.cpu, _PLAIN.numpy}
_VALUES_GIVEN = {torch.tensor, torch.as_tensor, torch.scalar_tensor}  # factories whose values are in the call


def _autograd_functions() -> set:
    """What reads or changes a tensor's own autograd state: run on the ``ServerTensor`` itself, since
    the plain view other operations get is another tensor to autograd (its own ``.grad``, a leaf no
    more)."""
    functions = {_PLAIN.requires_grad_, _PLAIN.retain_grad, _PLAIN.register_hook}
    functions |= {getattr(_PLAIN, name) for name in ("register_post_accumulate_grad_hook",) if hasattr(_PLAIN, name)}
    for name in ("requires_grad", "grad", "grad_fn", "is_leaf", "retains_grad", "_version", "output_nr"):
        functions.add(getattr(_PLAIN, name).__get__)
    for name in ("requires_grad", "grad", "data"):  # setters: on the tensor itself, not on a view of it
        functions |= {getattr(_PLAIN, name).__set__, getattr(_PLAIN, name).__delete__}
    return functions


_AUTOGRAD = _autograd_functions()
_ENGINE = {_PLAIN.backward, torch.autograd.backward, torch.autograd.grad}  # they run autograd's engine
_GRAD = _PLAIN.grad.__get__


def _dress_gradients(tensor: ServerTensor) -> None:
    """Gradients autograd computes for ``tensor`` reach Python (a ``Function``'s backward, ``.grad``,
    hooks) as ``ServerTensor`` s: host code in a backward asks them where they live too."""
    with torch._C.DisableTorchFunction():
        if not tensor.requires_grad:
            return
        hooks = tensor._backward_hooks or {}
        if not any(isinstance(h, functools.partial) and h.func is _dressed_gradient for h in hooks.values()):
            tensor.register_hook(functools.partial(_dressed_gradient, arg=tensor.arg))


def _dressed_gradient(grad: torch.Tensor, arg: str | None):
    return None if isinstance(grad, ServerTensor) else ServerTensor(grad, arg)


def _run_autograd(func, args, kwargs, server: list[ServerTensor]):
    """``func`` of ``_AUTOGRAD`` on the tensors as they are; a ``.grad`` is kept as a ``ServerTensor``
    (the same one on every read)."""
    with torch._C.DisableTorchFunctionSubclass():
        result = func(*args, **kwargs)
    for tensor in server:
        _dress_gradients(tensor)  # requires_grad_(): from now on
    if func == _GRAD and isinstance(args[0], ServerTensor) and type(result) is _PLAIN:
        dressed = ServerTensor(result, args[0].arg)
        with torch._C.DisableTorchFunction():
            args[0].grad = dressed
        return dressed
    return result


def _run_engine(func, args, kwargs, server: list[ServerTensor], mode: TorchFunctionMode | None):
    """``backward()``, ``torch.autograd.backward`` and ``torch.autograd.grad``, started below their own
    ``__torch_function__`` check: autograd's engine runs every node (a ``Function``'s backward, hooks)
    in the state it was started in, so it starts with the server's answers in place, and a backward
    sees ``ServerTensor`` s and allocates on ``cuda`` as it does on the server. The steps torch takes
    after that check are taken here in the same order (``_make_grads``, ``_engine_run_backward``)."""
    from torch.autograd import _make_grads
    from torch.autograd.graph import _engine_run_backward

    given = inspect.signature(func).bind(*args, **kwargs).arguments
    is_grad = func is torch.autograd.grad
    named_inputs = given.get("inputs")
    if given.get("is_grads_batched") or (named_inputs is not None and not _as_tuple(named_inputs)):
        with torch._C.DisableTorchFunctionSubclass():  # vmapped gradients, torch's own argument errors
            return func(*args, **kwargs)
    outputs = _as_tuple(given.get("self", given.get("tensors", given.get("outputs"))))
    inputs = _as_tuple(named_inputs) if named_inputs is not None else ()
    grads = given.get("gradient", given.get("grad_tensors", given.get("grad_outputs")))
    grads = (None,) * len(outputs) if grads is None else _as_tuple(grads)
    create_graph = bool(given.get("create_graph", False))
    retain_graph = given.get("retain_graph")
    materialize = bool(given.get("materialize_grads", False))
    allow_unused = given.get("allow_unused")
    for tensor in server:
        _dress_gradients(tensor)
    with mode if mode is not None else contextlib.nullcontext():
        grads = _make_grads(outputs, grads, is_grads_batched=False)
        result = _engine_run_backward(outputs, grads, create_graph if retain_graph is None else retain_graph,
                                      create_graph, inputs, (materialize if allow_unused is None else allow_unused)
                                      if is_grad else True, accumulate_grad=not is_grad)
        if not is_grad:
            return None
        arg = next((s.arg for s in server if s.arg), None)
        result = tuple(ServerTensor(r, arg) if type(r) is _PLAIN and isinstance(i, ServerTensor) else
                       torch.zeros_like(i, requires_grad=create_graph) if r is None and materialize else r
                       for r, i in zip(result, inputs, strict=True))
    return dict(zip(named_inputs, result, strict=True)) if isinstance(named_inputs, dict) else result


def _as_tuple(value) -> tuple:
    """Tensors as autograd's functions take them: one, a sequence, or a dict of them (``inputs``)."""
    from torch.autograd.graph import GradientEdge

    if isinstance(value, dict):
        return tuple(value.values())
    return (value,) if isinstance(value, (torch.Tensor, GradientEdge)) else tuple(value)


def _is_cuda(device, meta_as_cuda: bool = False) -> bool:
    types = ("cuda", "meta") if meta_as_cuda else ("cuda",)
    if isinstance(device, torch.device):
        return device.type in types
    if isinstance(device, str):
        return device.split(":")[0] in types
    return isinstance(device, int) and not isinstance(device, bool)


def _dispatch(func, args, kwargs, backing: torch.device | None, meta_as_cuda: bool = False,
              mode: TorchFunctionMode | None = None):
    """Run ``func`` on the plain tensors, allocate ``cuda`` on the backing device, dress the results
    (``meta_as_cuda``: plain ``meta`` tensors count as the server's too; ``mode``: the one that
    called, when one did)."""
    if func in _AUTOGRAD or func in _ENGINE:
        server = [a for a in _leaves((args, kwargs)) if isinstance(a, ServerTensor)]
        if func in _ENGINE:
            return _run_engine(func, args, kwargs, server, mode)
        return _run_autograd(func, args, kwargs, server)
    if meta_as_cuda:
        args, kwargs = tree_map(_dressed_meta, (args, kwargs))
    server = [a for a in _leaves((args, kwargs)) if isinstance(a, ServerTensor)]
    for tensor in server:
        _dress_gradients(tensor)  # one that came to require grad since (a Function's output)
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
    if func in _VALUES_GIVEN and not fakes:
        backing = torch.device("cpu")  # torch.tensor(1.0, device="cuda"): the call gives its values; keep them
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
    if fakes and to_host and func is _PLAIN.to and _device_type(kwargs.get("device", args[1:2] or None)) == "cpu":
        raise _data_error(".to('cpu')", server)
    unwrapped: dict[int, tuple[torch.Tensor, ServerTensor]] = {}  # id(plain view) -> (it, the ServerTensor)
    plain_args, plain_kwargs = tree_map(lambda v: _unwrap(v, fakes, unwrapped), (args, kwargs))
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

    def dressed(value):
        if id(value) in unwrapped and unwrapped[id(value)][0] is value:
            return unwrapped[id(value)][1]  # an input given back (in place, contiguous()): that very tensor
        return ServerTensor(value, arg) if type(value) is _PLAIN and value.device == backing else value

    return tree_map(dressed, result)


def _dressed_meta(value):
    """A plain ``meta`` tensor as a ``ServerTensor`` (what a program's stand-in for its GPU is)."""
    if type(value) is _PLAIN and value.device.type == "meta":
        return ServerTensor(value)
    return value


def _device_type(value) -> str | None:
    value = value[0] if isinstance(value, tuple) else value
    if isinstance(value, (torch.device, str)):
        return torch.device(value).type
    return None


def _is_device(value) -> bool:
    return isinstance(value, (torch.device, str)) or (isinstance(value, int) and not isinstance(value, bool))


def _unwrap(value, fakes: bool, unwrapped: dict):
    """A ``ServerTensor`` as a plain view of it (in autograd's graph, as the view of an input is)."""
    if isinstance(value, ServerTensor):
        tensor = value.as_subclass(_PLAIN)
        if fakes and tensor.device.type != "meta":
            return tensor.to("meta")  # a spec's real index tensor beside fakes: its values cannot matter here
        unwrapped[id(tensor)] = (tensor, value)
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


def _installed(filename: str) -> bool:
    """A file of an installed package (a library the program calls, not the program's own code)."""
    import sysconfig

    paths = sysconfig.get_paths()
    return os.path.abspath(filename).startswith(tuple(os.path.abspath(paths[k]) + os.sep
                                                      for k in ("purelib", "platlib")))


def user_frame(program: bool = False) -> str:
    """``file:line`` of the innermost frame outside torch, Triton, tritonwarm and the standard library
    (``program``: and outside installed packages: the line of the program's own code)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not _internal(name) and not (program and _installed(name)):
            return f"{name}:{frame.f_lineno}"
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
    if _dry_run.get():  # a program's dry run: no spec to give values in; name the program's own line
        reading, program = user_frame(), user_frame(program=True)
        inside = reading not in (program, "<unknown>")  # a library the program calls reads them
        if program == "<unknown>":  # the program itself is an installed package
            program, inside = reading, False
        return DataDependentError(
            f"{program}{f' (at {reading})' if inside else ''}: {what} reads the values of a device tensor ({shown}), "
            "which a dry run does not have: record this program on a machine with the GPU (tritonwarm record "
            "without --target), or " + ("warm that library call from a spec that gives the tensor's values (values:)"
                                        if inside else "leave this read out of a dry run"))
    named = f" (from {fake.arg})" if fake.arg else ""
    field = f"{fake.arg}.values" if fake.arg else "the tensor's values"
    return DataDependentError(
        f"{user_frame()}: {what} reads the values of a tensor warm-up only fakes{named}, {shown}: give them in "
        f"the spec with {field} (e.g. {{tensor: [4], dtype: int32, values: [0, 3, 5, 7]}})")
