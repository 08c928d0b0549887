"""Specialization sets: ``warmup_specs/*.yaml`` → validated specs → rows → launcher arguments.

A spec names a launcher, declares axes (value lists, integer ranges, zipped groups), an optional
filter, and the launcher's arguments as expressions over the axes. Everything is validated before
anything is traced or compiled; an error names the file, the line and the field.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import itertools
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from ...errors import clipped, describe_error
from ..core.specialization import class_reps, fake_tensor, scalar_class
from ..core.targets import Target

TOP_LEVEL_FIELDS = {"launcher", "kernel", "capture", "config", "description", "targets", "axes", "groups", "filter",
                    "args", "import_roots", "partial"}
CAPTURE_MODES = ("jitkernels", "all")
RANGE_FIELDS = {"range", "step", "collapse"}
TENSOR_FIELDS = {"tensor", "dtype", "stride", "aligned", "when", "values", "requires_grad"}
MAX_VALUES = 65536  # a tensor given by its values (index lists, counts) is small
MAX_DIM = 2**62  # a fake tensor's sizes, strides and element count stay below it (torch's int64 math)
_DIM_RANGE = "dimensions and strides are integers in [0, 2**62)"
MAX_ENUMERATED_RANGE = 4096
MAX_ROWS = 10_000  # the cross product of a spec's axes and groups, counted before anything is built
MAX_INT_BITS = 256  # integers an expression may build (2**64 fits; 9**9**9 does not)
MAX_SEQUENCE = 10_000  # items a string or list repetition may build
MAX_NESTING = 64  # lists and mappings inside each other (a recorded plan nests 8 deep; YAML's parser is quadratic)
MAX_EXPRESSION = 1000  # characters in one $expression (real ones are under 100)
MAX_EXPRESSION_DEPTH = 100  # operators inside each other in one expression (Python's compiler recurses)


class SpecError(ValueError):
    """A bad spec: ``file:line: field: message`` on one line."""

    def __init__(self, file, line: int | None, field: str, message: str):
        self.file, self.line, self.field = str(file), line, field
        where = f"{self.file}:{line}" if line else self.file
        super().__init__(f"{where}: {field}: {message}")


# --------------------------------------------------------------------------- YAML with line numbers


class _TooDeep(Exception):
    def __init__(self, mark):
        self.mark = mark


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, stopped at the first flow collection (``[``, ``{``) past ``MAX_NESTING``:
    its scanner checks every open flow level at every token (a 40 KB ``[[[...`` took 40 s), and its
    composer recurses once per level."""

    def fetch_flow_collection_start(self, TokenClass):
        if self.flow_level >= MAX_NESTING:
            raise _TooDeep(self.get_mark())
        super().fetch_flow_collection_start(TokenClass)


_PLAIN_TAGS = {"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"}


def _shown_tag(tag: str) -> str:
    """As the user wrote it: ``!!python/name:os.system``."""
    return "!!" + tag[len("tag:yaml.org,2002:"):] if tag.startswith("tag:yaml.org,2002:") else tag


class _Located:
    """YAML → plain Python values plus the line of every path, for error messages."""

    def __init__(self, file: Path):
        self.file = file
        self.lines: dict[tuple, int] = {}
        self._loader = yaml.SafeLoader("")  # only its scalar constructors are used

    def convert(self, node: yaml.Node, path: tuple) -> Any:
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) and node.tag not in _PLAIN_TAGS:
            raise SpecError(self.file, node.start_mark.line + 1, ".".join(map(str, path)) or "<spec>",
                            f"unsupported YAML tag {_shown_tag(node.tag)}: a spec holds plain values only")
        if isinstance(node, yaml.MappingNode):
            out = {}
            for key_node, value_node in node.value:
                key = key_node.value
                if key in out:
                    raise SpecError(self.file, key_node.start_mark.line + 1, ".".join(map(str, path + (key,))),
                                    "duplicate key")
                self.lines[path + (key,)] = key_node.start_mark.line + 1  # errors point at the field name
                out[key] = self.convert(value_node, path + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.convert(v, path + (i,)) for i, v in enumerate(node.value)]
        try:
            return self._loader.construct_object(node, deep=True)
        except yaml.YAMLError:  # an explicit tag such as !!python/name: plain values only
            raise SpecError(self.file, node.start_mark.line + 1, ".".join(map(str, path)) or "<spec>",
                            f"unsupported YAML tag {_shown_tag(node.tag)}: a spec holds plain values only") from None

    def line(self, path: tuple) -> int | None:
        while path and path not in self.lines:
            path = path[:-1]
        return self.lines.get(path)

    def error(self, path: tuple, message: str) -> SpecError:
        return SpecError(self.file, self.line(path), ".".join(map(str, path)) or "<spec>", message)


# --------------------------------------------------------------------------- expressions

_ALLOWED_NODES = (
    ast.Expression, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp, ast.Call, ast.Name, ast.Load,
    ast.Constant, ast.Tuple, ast.List, ast.And, ast.Or, ast.Not, ast.Add, ast.Sub, ast.Mult, ast.Div,
    ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE,
    ast.In, ast.NotIn,
)
_FUNCTIONS = {"min": min, "max": max, "abs": abs, "int": int,
              "cdiv": lambda a, b: -(-a // b), "next_power_of_2": lambda n: 1 << max(int(n) - 1, 0).bit_length()}


def _bounded_pow(base, exponent):
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        if (abs(base).bit_length() - 1) * exponent > MAX_INT_BITS:
            raise ValueError(f"{base}**{exponent} is too large (integers stop at 2**{MAX_INT_BITS})")
    return base**exponent


def _bounded_mul(a, b):
    if isinstance(a, int) and isinstance(b, int):
        if a.bit_length() + b.bit_length() > MAX_INT_BITS + 1:
            raise ValueError(f"{a} * {b} is too large (integers stop at 2**{MAX_INT_BITS})")
    for seq, n in ((a, b), (b, a)):
        if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * max(n, 0) > MAX_SEQUENCE:
            raise ValueError(f"repeating {len(seq)} items {n} times is too large (limit {MAX_SEQUENCE})")
    return a * b


_BOUNDED = {ast.Pow: "_bounded_pow", ast.Mult: "_bounded_mul"}
_RUNTIME = {"_bounded_pow": _bounded_pow, "_bounded_mul": _bounded_mul}


class _BoundArithmetic(ast.NodeTransformer):
    """``a ** b`` and ``a * b`` → calls that refuse results too large to build (``$9**9**9**9`` hangs)."""

    def visit_BinOp(self, node: ast.BinOp):
        self.generic_visit(node)
        name = _BOUNDED.get(type(node.op))
        if name is None:
            return node
        return ast.copy_location(ast.Call(ast.Name(name, ast.Load()), [node.left, node.right], []), node)


_CONSTRUCTS = {
    "Attribute": "attribute access (a.b)", "Subscript": "indexing (a[i])", "Lambda": "a lambda",
    "ListComp": "a comprehension", "SetComp": "a comprehension", "DictComp": "a comprehension",
    "GeneratorExp": "a comprehension", "NamedExpr": "assignment (:=)", "Starred": "unpacking (*)",
    "JoinedStr": "an f-string", "Dict": "a dict literal", "Set": "a set literal", "Await": "await",
    "BitAnd": "&", "BitOr": "|", "BitXor": "^", "LShift": "<<", "RShift": ">>", "Invert": "~", "MatMult": "@",
    "Is": "is", "IsNot": "is not",
}


def _construct(node: ast.AST) -> str:
    """What the user wrote, in words (not the name of Python's AST class)."""
    name = type(node).__name__
    return _CONSTRUCTS.get(name) or " ".join(re.findall(r"[A-Z][a-z]*", name)).lower() or name


def _depth(tree: ast.AST) -> int:
    """How deep the tree is, counted without recursing."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


class Expr:
    """A small, safe Python expression over axis names (``$2 * hidden``, filters)."""

    def __init__(self, text: str, names: set[str], where: SpecError):
        self.text = text
        self.where = where  # file, line and field, for errors found when evaluating
        if len(text) > MAX_EXPRESSION:  # Python's parser and compiler recurse: a long chain of + overflows them
            raise SpecError(where.file, where.line, where.field, f"an expression of {len(text)} characters, "
                            f"over the limit of {MAX_EXPRESSION}")
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as e:
            raise SpecError(where.file, where.line, where.field, f"bad expression {text!r}: {e.msg}") from None
        except (RecursionError, MemoryError):
            raise SpecError(where.file, where.line, where.field,
                            f"expression {clipped(text, 60)} nests too deep for Python's parser") from None
        if _depth(tree) > MAX_EXPRESSION_DEPTH:
            raise SpecError(where.file, where.line, where.field, f"expression {clipped(text, 60)} nests operators "
                            f"more than {MAX_EXPRESSION_DEPTH} deep (the limit for an expression)")
        for node in ast.walk(tree):
            if not isinstance(node, _ALLOWED_NODES):
                raise SpecError(where.file, where.line, where.field,
                                f"{_construct(node)} is not allowed in expression {text!r}")
            if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS):
                raise SpecError(where.file, where.line, where.field,
                                f"only {', '.join(_FUNCTIONS)} may be called in {text!r}")
            if isinstance(node, ast.Name) and node.id not in names and node.id not in _FUNCTIONS:
                raise SpecError(where.file, where.line, where.field, f"unknown axis {node.id!r} in {text!r}")
        tree = ast.fix_missing_locations(_BoundArithmetic().visit(tree))
        self.code = compile(tree, "<spec>", "eval")

    def __call__(self, row: dict[str, Any]) -> Any:
        return eval(self.code, {"__builtins__": {}, **_FUNCTIONS, **_RUNTIME}, dict(row))  # noqa: S307

    @property
    def axis_name(self) -> str | None:
        """The axis this expression names, when it is nothing more than that (``$dtype``)."""
        name = self.text.strip()
        return name if name.isidentifier() else None

    def evaluate(self, row: dict[str, Any]) -> Any:
        """Evaluate for validation: any failure is a ``SpecError`` naming the file, line and row."""
        try:
            return self(row)
        except Exception as e:
            shown = ", ".join(f"{k}={v}" for k, v in row.items())
            raise self.error(f"${self.text} fails for ({shown}): {describe_error(e)}") from None

    def error(self, message: str) -> SpecError:
        return SpecError(self.where.file, self.where.line, self.where.field, message)


# --------------------------------------------------------------------------- the spec


@dataclass
class Axis:
    name: str
    values: list[Any]
    collapsed_range: tuple[int, int] | None = None  # (lo, hi) when the values are class representatives
    line: int | None = None


@dataclass
class Row:
    label: str
    values: dict[str, Any]


@dataclass
class Spec:
    file: Path
    index: int  # YAML document number in the file
    kernel_path: str
    description: str
    targets: list[str]
    axes: list[Axis]
    groups: list[list[Axis]]
    filter: Expr | None
    args: Any  # dict or list of arg templates
    launcher: Any = field(repr=False, default=None)
    source_sha256: str = ""  # of the whole YAML file: part of the plan store's key
    capture_all: bool = False  # capture: all — every Triton kernel the launcher reaches, not only JitKernels
    config: Any = None  # a pinned autotune config: index, mapping or $expression, per row
    partial: str = ""  # a recorded plan that lacks launches (the program failed): why; warmup and check fail

    @property
    def name(self) -> str:
        return self.file.name if self.index == 0 else f"{self.file.name}[{self.index}]"

    def applies_to(self, target: Target) -> bool:
        return not self.targets or target.name in self.targets or target.backend in self.targets

    def rows(self) -> list[Row]:
        factors: list[list[dict[str, Any]]] = [[{a.name: v} for v in a.values] for a in self.axes]
        for group in self.groups:
            factors.append([{a.name: a.values[i] for a in group} for i in range(len(group[0].values))])
        rows = []
        for combo in itertools.product(*factors):
            values: dict[str, Any] = {}
            for part in combo:
                values.update(part)
            if self.filter is not None and not self.filter.evaluate(values):
                continue
            shown = ", ".join(f"{k}={v}" for k, v in values.items())
            rows.append(Row(f"{self.name}#{len(rows)} ({shown})", values))
        return rows

    def collapsed_axes(self) -> list[Axis]:
        return [a for a in self.axes if a.collapsed_range is not None]

    def call_arguments(self, row: dict[str, Any]) -> tuple[tuple, dict]:
        """The launcher's (args, kwargs) for one row: meta tensors, dtypes and evaluated scalars."""
        built = _build(self.args, row, self.capture_all)
        return (tuple(built), {}) if isinstance(built, list) else ((), built)

    def pinned_config(self, row: dict[str, Any]) -> Any:
        """The autotune config this row pins (an index or a mapping), or None."""
        return None if self.config is None else _build(self.config, row)

    def collapse_samples(self, axis: Axis, value: int, seed: int) -> list[int]:
        """Other values of ``axis`` in ``value``'s class, to check the collapse is sound."""
        lo, hi = axis.collapsed_range
        cls = scalar_class(value)
        candidates = {lo, hi, lo + 1, hi - 1, hi - 16, (lo + hi) // 2}
        candidates |= {1 << k for k in range(max(lo, 1).bit_length(), hi.bit_length() + 1)}
        rng = random.Random(seed)
        candidates |= {rng.randint(lo, hi) for _ in range(4)}
        same = sorted(c for c in candidates if lo <= c <= hi and c != value and scalar_class(c) == cls)
        if len(same) > 4:  # ends of the class range plus two in between
            same = [same[0], same[len(same) // 3], same[2 * len(same) // 3], same[-1]]
        return same


class _TensorArg:
    def __init__(self, shape, dtype, stride, aligned, when, values=None, path="", requires_grad=False):
        self.shape, self.dtype, self.stride, self.aligned, self.when = shape, dtype, stride, aligned, when
        self.values = values  # the tensor's data, for host code that reads it (.item(), .tolist(), nonzero())
        self.path = path  # "args.idx": named when host code reads the values of a fake
        self.requires_grad = requires_grad  # a training call's input: a library's gradient branches run


class _DtypeArg:
    def __init__(self, dtype):
        self.dtype = dtype


def _build(template, row, serving: bool = False):
    """One row's launcher arguments. ``serving`` (``capture: all``): tensors are ``ServerTensor`` s,
    which host code sees on ``cuda`` as on the server."""
    if isinstance(template, Expr):
        return template(row)
    if isinstance(template, _TensorArg):
        if not _build(template.when, row):
            return None
        dtype = _dtype(_build(template.dtype, row))
        shape = [int(_build(s, row)) for s in template.shape]
        stride = None if template.stride is None else [int(_build(s, row)) for s in template.stride]
        aligned = bool(_build(template.aligned, row))
        tensor = fake_tensor(shape, dtype, stride=stride, aligned=aligned)
        if template.values is not None:
            tensor = tensor_with_values(tensor, _build(template.values, row))
        if _build(template.requires_grad, row):
            tensor.requires_grad_(True)
        if serving:
            from ..core.server_tensors import as_server_tensor

            tensor = as_server_tensor(tensor, template.path)
        return tensor
    if isinstance(template, _DtypeArg):
        return _dtype(_build(template.dtype, row))
    if isinstance(template, list):
        return [_build(t, row, serving) for t in template]
    if isinstance(template, dict):
        return {k: _build(v, row, serving) for k, v in template.items()}
    return template


def _flat(values) -> list:
    if isinstance(values, (list, tuple)):
        return [x for v in values for x in _flat(v)]
    return [values]


def tensor_with_values(fake: torch.Tensor, values) -> torch.Tensor:
    """A real CPU tensor with ``fake``'s dtype, shape, strides, storage offset and storage size, holding
    ``values`` (row-major, nested lists flattened): host code can read it; Triton sees the same layout."""
    flat = _flat(values)
    if len(flat) != fake.numel():
        raise ValueError(f"{len(flat)} values for a tensor of shape {list(fake.shape)} ({fake.numel()} elements)")
    storage = torch.zeros(fake.untyped_storage().nbytes() // fake.element_size(), dtype=fake.dtype)
    tensor = storage.as_strided(fake.shape, fake.stride(), fake.storage_offset())
    tensor.copy_(torch.tensor(flat, dtype=fake.dtype).reshape(fake.shape))
    return tensor


def _validate(template, row, loc: _Located):
    """What ``_build`` does for one row, without building a tensor: every expression evaluates and
    every dtype is known, or a ``SpecError`` names the file, line and field before anything is traced."""
    if isinstance(template, Expr):
        return template.evaluate(row)
    if isinstance(template, _TensorArg):
        if not _validate(template.when, row, loc):
            return None
        _validate_dtype(template.dtype, row, loc)
        shape = [_dimension(d, row, loc) for d in template.shape]
        for d in template.stride or []:
            _dimension(d, row, loc)
        if math.prod(shape) >= MAX_DIM:
            raise loc.error((), f"a tensor of shape {shape} has 2**62 elements or more")
        _validate(template.aligned, row, loc)
        _validate_requires_grad(template, row, loc)
        if template.values is not None:
            values = _flat(_validate(template.values, row, loc))
            path = _template_path(template) + ("values",)
            if len(values) > MAX_VALUES:
                raise loc.error(path, f"{len(values)} values: a tensor given by its values has at most {MAX_VALUES}")
            if len(values) != math.prod(shape):
                raise loc.error(path, f"{len(values)} values for a tensor of shape {shape} ({math.prod(shape)} "
                                      "elements)")
            bad = next((v for v in values if isinstance(v, str) or v is None), None)
            if bad is not None:
                raise loc.error(path, f"{bad!r} is not a number")
        return None
    if isinstance(template, _DtypeArg):
        return _validate_dtype(template.dtype, row, loc)
    if isinstance(template, list):
        return [_validate(t, row, loc) for t in template]
    if isinstance(template, dict):
        return {k: _validate(v, row, loc) for k, v in template.items()}
    return template


def _template_path(template: _TensorArg) -> tuple:
    """The tensor's path in the spec (list positions as numbers), for the line of an error."""
    return tuple(int(p) if p.isdigit() else p for p in template.path.split("."))


def _validate_requires_grad(template: _TensorArg, row, loc: _Located) -> None:
    """``requires_grad`` is true or false, and true only for a dtype autograd differentiates."""
    path = _template_path(template) + ("requires_grad",)
    value = _validate(template.requires_grad, row, loc)
    if not isinstance(value, bool):
        shown = f"${template.requires_grad.text} gives {value!r}" if isinstance(template.requires_grad, Expr) \
            else repr(value)
        raise loc.error(path, f"{shown}: must be true or false")
    dtype = _validate_dtype(template.dtype, row, loc)
    if value and not (dtype.is_floating_point or dtype.is_complex):
        raise loc.error(path, f"a {str(dtype).replace('torch.', '')} tensor cannot require grad: only floating-point "
                              "and complex tensors can")


def _dimension(template, row, loc: _Located) -> int:
    """A size or stride of one row, in [0, 2**62) or a ``SpecError`` naming the expression."""
    value = _validate(template, row, loc)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_DIM:
        message = f"{value!r} is not a dimension: {_DIM_RANGE}"
        raise (template.error(message) if isinstance(template, Expr) and template.where else loc.error((), message))
    return value


def _validate_dtype(template, row, loc):
    value = _validate(template, row, loc)
    try:
        return _dtype(value)
    except ValueError:
        raise template.error(f"unknown dtype {value!r} from ${template.text} "
                             "(a torch dtype name, e.g. bfloat16)") from None


def _dtype(value):
    if isinstance(value, torch.dtype):
        return value
    dtype = getattr(torch, str(value), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {value!r}")
    return dtype


# --------------------------------------------------------------------------- parsing


def load_spec_file(path: str | Path) -> list[Spec]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(path, None, "<file>", e.strerror or str(e)) from None
    except UnicodeDecodeError as e:
        raise SpecError(path, None, "<file>", f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    too_deep = f"lists and mappings nest more than {MAX_NESTING} deep (the limit for a spec)"
    try:
        depth = 0
        for event in yaml.parse(text, Loader=_BoundedLoader):  # before composing: nothing is expanded yet
            if isinstance(event, yaml.AliasEvent):  # a billion-laughs spec expands exponentially
                raise SpecError(path, event.start_mark.line + 1, "<yaml>",
                                "YAML aliases (*name) are not supported in a spec: write the values out")
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_NESTING:  # block nesting (indentation); flow nesting stops in the scanner
                    raise SpecError(path, event.start_mark.line + 1, "<yaml>", too_deep)
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        documents = list(yaml.compose_all(text, Loader=_BoundedLoader))
    except _TooDeep as e:
        raise SpecError(path, e.mark.line + 1, "<yaml>", too_deep) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise SpecError(path, mark.line + 1 if mark else None, "<yaml>",
                        str(getattr(e, "problem", None) or e)) from None
    specs = []
    for index, node in enumerate(d for d in documents if d is not None):
        located = _Located(path)
        data = located.convert(node, ())
        spec = _parse(path, index, data, located)
        spec.source_sha256 = hashlib.sha256(text.encode()).hexdigest()
        specs.append(spec)
    if not specs:
        raise SpecError(path, None, "<file>", "no specialization set in file")
    return specs


def find_spec_files(paths: list[str | Path]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted([*p.glob("*.yaml"), *p.glob("*.yml")])
            if not found:
                raise SpecError(p, None, "<directory>", "no specs in it (*.yaml, *.yml)")
            files.extend(found)
        elif p.exists():
            files.append(p)
        else:
            raise SpecError(p, None, "<file>", "no such file or directory")
    return files


def load_specs(paths: list[str | Path]) -> list[Spec]:
    return [spec for f in find_spec_files(paths) for spec in load_spec_file(f)]


def _parse(path: Path, index: int, data: Any, loc: _Located) -> Spec:
    if not isinstance(data, dict):
        raise loc.error((), "a specialization set must be a mapping")
    for key in data:
        if key not in TOP_LEVEL_FIELDS:
            raise loc.error((key,), f"unknown field (expected one of {', '.join(sorted(TOP_LEVEL_FIELDS))})")
    if "launcher" in data and "kernel" in data:
        raise loc.error(("kernel",), "give the launcher once: 'launcher:' (or its older name 'kernel:'), not both")
    launcher_field = "kernel" if "kernel" in data else "launcher"
    kernel_path = data.get(launcher_field)
    if not isinstance(kernel_path, str):
        raise loc.error((launcher_field,) if launcher_field in data else (),
                        "required: the launcher as 'module:attribute' (any function)")
    _add_import_roots(data.get("import_roots", []), path, loc)
    capture = data.get("capture", "jitkernels")
    if capture not in CAPTURE_MODES:
        raise loc.error(("capture",), f"unknown capture mode {capture!r}: choose one of {', '.join(CAPTURE_MODES)}")
    if capture == "all":  # another package's code: imported under each target's answers, when traced
        launcher = _launcher_imported_per_target(kernel_path, loc, launcher_field)
    else:
        launcher = _import_launcher(kernel_path, loc, launcher_field)
    description = data.get("description", "")
    if not isinstance(description, str):
        raise loc.error(("description",), "must be a string")
    partial = data.get("partial", "")
    if not isinstance(partial, str):
        raise loc.error(("partial",), f"{partial!r}: must be a string (why the recorded plan lacks launches)")
    targets = data.get("targets", [])
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise loc.error(("targets",), "must be a list of backends (cuda, hip) or target names")
    from ..core.targets import TARGETS

    for i, t in enumerate(targets):
        if t not in ("cuda", "hip") and t not in TARGETS:
            raise loc.error(("targets", i), f"unknown target {t!r}: choose cuda, hip or one of {', '.join(TARGETS)}")

    axes = [_parse_axis(name, value, ("axes", name), loc) for name, value in _mapping(data, "axes", loc).items()]
    groups = []
    for gname, members in _mapping(data, "groups", loc).items():
        if not isinstance(members, dict) or not members:
            raise loc.error(("groups", gname), "a group maps axis names to lists of equal length")
        group = []
        for name, values in members.items():
            if not isinstance(values, list) or not values:
                raise loc.error(("groups", gname, name), "must be a non-empty list")
            group.append(Axis(name, values, line=loc.line(("groups", gname, name))))
        lengths = {len(a.values) for a in group}
        if len(lengths) != 1:
            raise loc.error(("groups", gname), f"zipped lists differ in length: {sorted(lengths)}")
        groups.append(group)

    names: list[str] = [a.name for a in axes] + [a.name for g in groups for a in g]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise loc.error(("groups",), f"axis defined twice: {', '.join(sorted(dupes))}")
    known = set(names)

    filter_expr = None
    if "filter" in data:
        if not isinstance(data["filter"], str):
            raise loc.error(("filter",), "must be an expression string")
        filter_expr = Expr(data["filter"], known, loc.error(("filter",), ""))

    if "args" not in data:
        raise loc.error((), "required field 'args' is missing")
    args = data["args"]
    if not isinstance(args, (dict, list)):
        raise loc.error(("args",), "must be a mapping (by name) or a list (positional)")
    parsed = _parse_template(args, ("args",), known, loc)  # first: it bounds nesting and expressions
    if capture != "all":  # a capture: all launcher is imported when traced: its rows say it
        _check_arguments(launcher, args, loc)
    args = parsed
    config = None
    if "config" in data:
        config = data["config"]
        if isinstance(config, bool) or not isinstance(config, (int, dict, str)) or (
                isinstance(config, str) and not config.startswith("$")):
            raise loc.error(("config",), "a pinned autotune config is an index, a mapping of meta-parameters and "
                                         "options (e.g. {BLOCK: 128, num_warps: 4}) or a $expression")
        config = _parse_template(config, ("config",), known, loc)
    combinations = 1
    for count in [len(a.values) for a in axes] + [len(g[0].values) for g in groups]:
        combinations *= count
    if combinations > MAX_ROWS:
        raise loc.error(("axes",) if axes else ("groups",),
                        f"{combinations} rows (the product of every axis and group; at most {MAX_ROWS}): collapse "
                        "runtime scalars, add steps, or split the spec")
    _validate_axis_dtypes(args, axes + [a for g in groups for a in g], loc)
    spec = Spec(path, index, kernel_path, description, targets, axes, groups, filter_expr, args, launcher,
                capture_all=capture == "all", config=config, partial=partial)
    rows = spec.rows()
    if not rows:
        raise loc.error(("filter",) if filter_expr else (), "the spec has no rows")
    for row in rows:
        _validate(args, row.values, loc)
    return spec


def arguments_problem(launcher, args, kwargs) -> str | None:
    """Why ``launcher(*args, **kwargs)`` cannot bind (a wrong argument name, a missing one), with the
    launcher's parameters; None when it binds or the launcher has no signature to read."""
    try:  # as called: a decorator's own (*args, **kwargs) binds anything, never refused here
        signature = inspect.signature(launcher, follow_wrapped=False)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*args, **kwargs)
    except TypeError as e:
        bare = signature.replace(parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
                                 return_annotation=signature.empty)
        return f"{e}: the launcher is {getattr(launcher, '__name__', 'the launcher')}{bare}"
    return None


def _check_arguments(launcher, args, loc: _Located) -> None:
    """The spec's ``args`` fit the launcher's parameters: ``epsilon:`` for ``eps`` is one line naming
    the field, not one ``TypeError`` per row."""
    positional, named = (list(args), {}) if isinstance(args, list) else ([], dict(args))
    problem = arguments_problem(launcher, positional, named)
    if problem is None:
        return
    quoted = re.search(r"'(\w+)'", problem)
    where = ("args", quoted.group(1)) if quoted and quoted.group(1) in named else ("args",)
    raise loc.error(where, problem)


def jit_kernel_named(launcher, kernel_path: str) -> str | None:
    """What to say when the spec names a ``@triton.jit`` kernel (or its autotuner) where the host
    function that launches it belongs: such an object only runs as ``kernel[grid](...)``."""
    from triton.runtime.jit import KernelInterface

    if not isinstance(launcher, KernelInterface):
        return None
    return (f"{kernel_path!r} is a @triton.jit kernel, not a launcher: name the Python (host) function that launches "
            "it as kernel[grid](...), or wrap the kernel in a JitKernel with its launch spec (docs/launch-specs.md)")


def _validate_axis_dtypes(template, axes: list[Axis], loc: _Located) -> None:
    """A ``dtype: $axis`` names an axis whose every value must be a dtype: the error points at the value."""
    by_name = {a.name: a for a in axes}
    for dtype_template in _dtype_templates(template):
        axis = by_name.get(dtype_template.axis_name) if isinstance(dtype_template, Expr) else None
        if axis is None:
            continue
        for i, value in enumerate(axis.values):
            try:
                _dtype(value)
            except ValueError:
                candidates = [("axes", axis.name, i)] + [p for p in loc.lines
                                                         if p[:1] == ("groups",) and p[2:] == (axis.name, i)]
                path = next((p for p in candidates if p in loc.lines), ("axes", axis.name))
                raise loc.error(path, f"unknown dtype {value!r} (a torch dtype name, e.g. bfloat16), used by "
                                      f"{dtype_template.where.field}") from None


def _dtype_templates(template):
    if isinstance(template, _TensorArg):
        yield template.dtype
    elif isinstance(template, _DtypeArg):
        yield template.dtype
    elif isinstance(template, list):
        for t in template:
            yield from _dtype_templates(t)
    elif isinstance(template, dict):
        for t in template.values():
            yield from _dtype_templates(t)


def _mapping(data, key, loc) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise loc.error((key,), "must be a mapping")
    return value


def _parse_axis(name: str, value: Any, path: tuple, loc: _Located) -> Axis:
    line = loc.line(path)
    if isinstance(value, list):
        if not value:
            raise loc.error(path, "empty value list")
        return Axis(name, value, line=line)
    if not isinstance(value, dict) or "range" not in value:
        raise loc.error(path, "an axis is a list of values or {range: [lo, hi], step: N | collapse: true}")
    for key in value:
        if key not in RANGE_FIELDS:
            raise loc.error(path + (key,), f"unknown field (expected one of {', '.join(sorted(RANGE_FIELDS))})")
    bounds = value["range"]
    if (not isinstance(bounds, list) or len(bounds) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)):
        raise loc.error(path + ("range",), "must be [lo, hi], two integers")
    lo, hi = bounds
    if lo > hi:
        raise loc.error(path + ("range",), f"empty range: {lo} > {hi}")
    collapse = value.get("collapse", False)
    if not isinstance(collapse, bool):
        raise loc.error(path + ("collapse",), "must be true or false")
    step = value.get("step", 1)
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise loc.error(path + ("step",), "must be a positive integer")
    if collapse:
        if "step" in value:
            raise loc.error(path + ("step",), "a collapsed range takes no step: it keeps one value per class")
        try:
            reps = class_reps(lo, hi)
        except ValueError as e:
            raise loc.error(path + ("range",), str(e)) from None
        return Axis(name, list(reps.values()), collapsed_range=(lo, hi), line=line)
    count = (hi - lo) // step + 1  # counted, not built: [1, 2**40] must not allocate
    if count > MAX_ENUMERATED_RANGE:
        raise loc.error(path + ("range",), f"{count} values to enumerate (at most {MAX_ENUMERATED_RANGE}): add a "
                                             "step, or collapse: true if the value reaches the kernel only as a "
                                             "runtime scalar (where the collapse check finds the variants change at "
                                             "a value, split the range there into collapsed ranges)")
    return Axis(name, list(range(lo, hi + 1, step)), line=line)


def _parse_template(value: Any, path: tuple, names: set[str], loc: _Located):
    if isinstance(value, str) and value.startswith("$"):
        return Expr(value[1:], names, loc.error(path, ""))
    if isinstance(value, list):
        return [_parse_template(v, path + (i,), names, loc) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if "tensor" in value:
            for key in value:
                if key not in TENSOR_FIELDS:
                    raise loc.error(path + (key,),
                                f"unknown tensor field (expected {', '.join(sorted(TENSOR_FIELDS))})")
            shape = value["tensor"]
            if not isinstance(shape, list):
                raise loc.error(path + ("tensor",), "the shape must be a list")
            if "dtype" not in value:
                raise loc.error(path, "a tensor needs a dtype")
            stride = value.get("stride")
            if stride is not None and (not isinstance(stride, list) or len(stride) != len(shape)):
                raise loc.error(path + ("stride",), "must be a list as long as the shape")
            aligned = value.get("aligned", True)
            tensor = _TensorArg(
                [_parse_template(s, path + ("tensor", i), names, loc) for i, s in enumerate(shape)],
                _parse_dtype(value["dtype"], path + ("dtype",), names, loc),
                None if stride is None else [_parse_template(s, path + ("stride", i), names, loc)
                                             for i, s in enumerate(stride)],
                _parse_template(aligned, path + ("aligned",), names, loc),
                _parse_template(value.get("when", True), path + ("when",), names, loc),
                None if value.get("values") is None else _parse_template(value["values"], path + ("values",),
                                                                         names, loc),
                ".".join(map(str, path)),
                _parse_template(value.get("requires_grad", False), path + ("requires_grad",), names, loc),
            )
            for field_name, dims in (("tensor", tensor.shape), ("stride", tensor.stride or [])):
                for i, s in enumerate(dims):
                    if not isinstance(s, (int, Expr)) or isinstance(s, bool):
                        raise loc.error(path + (field_name, i), f"a dimension must be an int or $expression, not {s!r}")
                    if isinstance(s, int) and not 0 <= s < MAX_DIM:
                        raise loc.error(path + (field_name, i), f"{s} is not a dimension: {_DIM_RANGE}")
            if not isinstance(tensor.aligned, (bool, Expr)):
                raise loc.error(path + ("aligned",), "must be true, false or a $expression")
            if not isinstance(tensor.requires_grad, (bool, Expr)):
                raise loc.error(path + ("requires_grad",), f"{tensor.requires_grad!r}: must be true, false or a "
                                                           "$expression")
            return tensor
        if set(value) == {"dtype"}:
            return _DtypeArg(_parse_dtype(value["dtype"], path + ("dtype",), names, loc))
        return {k: _parse_template(v, path + (k,), names, loc) for k, v in value.items()}
    return value


def _parse_dtype(value, path, names, loc):
    if isinstance(value, str) and value.startswith("$"):
        return Expr(value[1:], names, loc.error(path, ""))
    try:
        return _dtype(value)
    except ValueError:
        raise loc.error(path, f"unknown dtype {value!r} (a torch dtype name, e.g. bfloat16)") from None


# Plans recorded before the adoption package had its present name still replay.
_RENAMED_MODULES = {"tritonwarm.jit.thirdparty.": "tritonwarm.jit.adopt."}


def _add_import_roots(roots, path: Path, loc: _Located) -> None:
    """``import_roots``: folders the launcher's modules import from (a program's own folder, what it
    added to ``sys.path``), put first on ``sys.path`` as the program had them; relative ones are read
    from the spec file's folder. A folder that is not there is left out: the modules may be installed."""
    import sys

    if not isinstance(roots, list) or not all(isinstance(r, str) and r for r in roots):
        raise loc.error(("import_roots",), "must be a list of folders")
    for root in reversed(roots):
        folder = str((path.parent / root).resolve())
        if Path(folder).is_dir() and folder not in sys.path:
            sys.path.insert(0, folder)


def _module_and_attribute(kernel_path: str, loc: _Located, where: str) -> tuple[str, str]:
    module_name, _, attr = kernel_path.partition(":")
    for old, new in _RENAMED_MODULES.items():
        if module_name.startswith(old):
            module_name = new + module_name[len(old):]
    if not module_name or not attr:
        raise loc.error((where,), f"{kernel_path!r} is not 'module:attribute'")
    return module_name, attr


class LauncherImportedPerTarget:
    """A ``capture: all`` spec's launcher: its module is imported when a row is traced, under the
    answers of the target traced for (``adopt.imports``), once for each target, so import-time
    probes, autotune config lists and constexpr globals take that target's values."""

    def __init__(self, kernel_path: str, module_name: str, attr: str, where: str):
        self.kernel_path, self.module_name, self.attr, self.where = kernel_path, module_name, attr, where
        self.__module__ = module_name  # the plan store fingerprints the launcher's package

    def resolve(self, target=None):
        from ..adopt.imports import current_target, import_failure, import_for_target

        target = target if target is not None else current_target()
        try:
            module = import_for_target(self.module_name, target)
        except Exception as e:  # the module's own code failed at import: say which spec, module and target
            raise ImportError(f"{self.where}: {import_failure(self.module_name, target, e)}") from e
        launcher = module
        for part in self.attr.split("."):
            launcher = getattr(launcher, part, None)
            if launcher is None:
                raise LookupError(f"{self.where}: {self.module_name!r} has no {self.attr!r}")
        jit_kernel = jit_kernel_named(launcher, self.kernel_path)
        if jit_kernel:
            raise LookupError(f"{self.where}: {jit_kernel}")
        if not callable(launcher):
            raise LookupError(f"{self.where}: {self.kernel_path!r} is not callable")
        return launcher

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"LauncherImportedPerTarget({self.kernel_path})"


def _launcher_imported_per_target(kernel_path: str, loc: _Located, where: str) -> LauncherImportedPerTarget:
    """Checked without running the module (its import-time probes must see the target, not this machine)."""

    module_name, attr = _module_and_attribute(kernel_path, loc, where)
    try:
        found = _located(module_name)
    except (ImportError, ValueError) as e:
        raise loc.error((where,), f"cannot import {module_name!r}: {e}") from None
    if found is None:
        raise loc.error((where,), f"cannot import {module_name!r}: No module named {module_name!r}")
    return LauncherImportedPerTarget(kernel_path, module_name, attr, f"{loc.file}:{loc.line((where,))}: {where}")


def _located(module_name: str):
    """``module_name``'s import spec, found as ``import`` finds it (``sys.meta_path``) but without
    running it or its parent packages (whose ``__init__`` may ask the GPU too)."""
    import sys

    path = None
    found = None
    parts = module_name.split(".")
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        loaded = sys.modules.get(name)
        if loaded is not None and getattr(loaded, "__spec__", None) is not None:
            found = loaded.__spec__
        else:
            found = next((spec for finder in sys.meta_path if hasattr(finder, "find_spec")
                          for spec in [finder.find_spec(name, path, None)] if spec is not None), None)
        if found is None:
            return None
        path = found.submodule_search_locations
        if path is None and i < len(parts) - 1:
            return None  # a module, not a package: it has no submodules
    return found


def _import_launcher(kernel_path: str, loc: _Located, where: str = "kernel"):
    module_name, attr = _module_and_attribute(kernel_path, loc, where)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise loc.error((where,), f"cannot import {module_name!r}: {e}") from None
    launcher = module
    for part in attr.split("."):
        launcher = getattr(launcher, part, None)
        if launcher is None:
            raise loc.error((where,), f"unknown {where}: {module_name!r} has no {attr!r}")
    jit_kernel = jit_kernel_named(launcher, kernel_path)
    if jit_kernel:
        raise loc.error((where,), jit_kernel)
    if inspect.isbuiltin(launcher) or inspect.isclass(launcher) or not callable(launcher):
        what = ("a built-in function" if inspect.isbuiltin(launcher) else "a class" if inspect.isclass(launcher)
                else "not callable")
        raise loc.error((where,), f"{kernel_path!r} is {what}: expected 'module:function' naming a Python "
                                  "launcher function that launches Triton kernels")
    return launcher
