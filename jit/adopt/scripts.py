"""Kernels defined in a program's main script, found again from another process.

A program run as ``python prog.py`` defines its kernels in ``__main__``, which no other process can
import. ``record`` names such a kernel by the script's path (``/path/prog.py:add_kernel``), and a
warm-up loads the script as a module of that name: its definitions run (imports, functions,
classes, assignments), its work does not (the ``if __name__ == "__main__":`` block, bare calls and
loops at top level). Triton's key of a kernel hashes its source, its starting line and the
module-level ``tl.constexpr`` values it reads, never the module's name, so the kernel loaded so has
the key the program computed.
"""

from __future__ import annotations

import ast
import os
import sys
import threading
import types
from pathlib import Path

_lock = threading.RLock()
# Top-level statements that define names; everything else at top level is the program's work.
_DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign,
                ast.AnnAssign, ast.AugAssign, ast.If, ast.Try)


def is_script_locator(module_name: str) -> bool:
    """Whether the module part of a ``module:qualname`` locator is a script's path."""
    return module_name.endswith(".py") and os.sep in module_name


def script_locator(main_file: str, qualname: str) -> str:
    return f"{Path(main_file).resolve()}:{qualname}"


def load_script(path: str) -> types.ModuleType:
    """The script at ``path`` as a module named by its path (once a process), its work left out.
    Its folder goes first on ``sys.path``, where Python puts it when the script runs."""
    with _lock:
        module = sys.modules.get(path)
        if module is not None:
            return module
        source = Path(path).read_text()
        tree = ast.parse(source, path)
        folder = str(Path(path).parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        module = types.ModuleType(path)
        module.__file__ = path
        module.__tritonwarm_skipped__ = []  # statements that failed: named when a kernel is not found
        sys.modules[path] = module
        for statement in tree.body:
            if not isinstance(statement, _DEFINITIONS) or _is_main_guard(statement):
                continue
            try:
                exec(compile(ast.Module([statement], []), path, "exec"), module.__dict__)
            except Exception as e:  # a definition that needs the program's GPU or its arguments
                module.__tritonwarm_skipped__.append(f"line {statement.lineno}: {type(e).__name__}: {e}")
        return module


def _is_main_guard(statement: ast.stmt) -> bool:
    if not isinstance(statement, ast.If) or not isinstance(statement.test, ast.Compare):
        return False
    sides = [statement.test.left, *statement.test.comparators]
    return (any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
            and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides))
