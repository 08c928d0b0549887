"""``tritonwarm record -o PLAN [--target T] -- COMMAND...``: run a program, write what it launched as a plan."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import UsageError, target_name

_BOOTSTRAP = '''\
"""Installs tritonwarm's recorder in every Python process of the recorded command."""
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
_this = sys.modules.pop("sitecustomize", None)
_path = list(sys.path)
sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != os.path.realpath(_here)]
try:  # the sitecustomize this one shadows, if there is one
    import sitecustomize  # noqa: F401
except ImportError:
    pass
finally:
    sys.path[:] = _path
    sys.modules["sitecustomize"] = _this  # the import system looks itself up when this file ends
from tritonwarm.jit.adopt.record import install_from_env

install_from_env()
'''


def add_parsers(sub) -> None:
    r = sub.add_parser("record", help="run a program and write every Triton kernel it launches as a replayable plan",
                       description="Run COMMAND (e.g. python prog.py ARGS) with Triton's compile hook installed in "
                                   "its Python processes; write the launches as a spec file that `tritonwarm "
                                   "warmup PLAN --target T` compiles for any target.")
    r.add_argument("-o", "--output", required=True, metavar="PLAN", help="the plan (a spec YAML file) to write")
    r.add_argument("--target", help="dry run: the program runs on meta tensors for this target (sm90, gfx942, ...) "
                                    "and nothing compiles; default: watch real launches on this machine's GPU")
    r.add_argument("command", nargs="...", metavar="-- COMMAND", help="the program to run")
    r.set_defaults(func=cmd_record)


def cmd_record(args) -> int:
    from ..jit.targets import local_target
    from ..jit.adopt.record import OUT_ENV, TARGET_ENV, read_record, write_plan

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise UsageError("record: nothing to run: give the command after --, e.g. -- python prog.py")
    target = target_name(args)
    if target is None and local_target() is None:
        raise UsageError("record: no GPU on this machine: pass --target T for a dry run on meta tensors")
    output = Path(args.output)
    if output.parent and not output.parent.exists():
        raise UsageError(f"record: -o {output}: no such directory {output.parent}")
    with tempfile.TemporaryDirectory(prefix="tritonwarm-record-") as tmp:
        Path(tmp, "sitecustomize.py").write_text(_BOOTSTRAP)
        record = Path(tmp, "record.jsonl")
        env = dict(os.environ, **{OUT_ENV: str(record), TARGET_ENV: target or ""})
        package_root = str(Path(__file__).resolve().parent.parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tmp, package_root, os.environ.get("PYTHONPATH")) if p)
        try:
            returncode = subprocess.call(command, env=env)
        except OSError as e:
            raise UsageError(f"record: cannot run {command[0]!r}: {e.strerror or e}") from None
        rows, errors = read_record(record)
    for error in errors:
        print(f"not recorded: {error}", file=sys.stderr)
    if not rows:
        print(f"tritonwarm: the program launched no Triton kernel (exit status {returncode}): no plan written",
              file=sys.stderr)
        return 1
    write_plan(rows, output, command, target)
    kernels = {r["kernel"] for r in rows}
    print(f"recorded {len({repr(sorted(r.items())) for r in rows})} launches of {len(kernels)} kernels "
          f"({'dry run for ' + target if target else 'on this GPU'}) -> {output}")
    if returncode != 0:
        print(f"tritonwarm: the program exited with status {returncode}: the plan holds what it launched before",
              file=sys.stderr)
        return 1
    return 0
