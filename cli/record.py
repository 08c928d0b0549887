"""``tritonwarm record -o PLAN [--target T] -- COMMAND...``: run a program, write what it launched as a plan."""

from __future__ import annotations

import json
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
    r.add_argument("--trace", metavar="RECORD",
                   help="also write the dispatch record of the real run: each variant launched, found in Triton's "
                        "cache or not; `tritonwarm check --trace RECORD` compares it with a warmed cache")
    r.add_argument("command", nargs="...", metavar="-- COMMAND", help="the program to run")
    r.set_defaults(func=cmd_record)


def cmd_record(args) -> int:
    from ..jit.adopt.record import OUT_ENV, TARGET_ENV, TRACE_ENV, USER_PATH_ENV, read_record, write_plan
    from ..jit.core.dispatch_record import write_record
    from ..jit.core.targets import local_target

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise UsageError("record: nothing to run: give the command after --, e.g. -- python prog.py")
    target = target_name(args)
    if target is None and local_target() is None:
        raise UsageError("record: no GPU on this machine: pass --target T for a dry run on meta tensors")
    if target is not None and args.trace:
        raise UsageError("record: --trace records what a real run found in Triton's cache: not with --target "
                         "(a dry run launches nothing)")
    output = Path(args.output)
    for path, flag in ((output, "-o"), (Path(args.trace) if args.trace else None, "--trace")):
        if path is not None and path.parent and not path.parent.exists():
            raise UsageError(f"record: {flag} {path}: no such directory {path.parent}")
    with tempfile.TemporaryDirectory(prefix="tritonwarm-record-") as tmp:
        Path(tmp, "sitecustomize.py").write_text(_BOOTSTRAP)
        record = Path(tmp, "record.jsonl")
        user_path = os.environ.get("PYTHONPATH", "")
        env = dict(os.environ, **{OUT_ENV: str(record), TARGET_ENV: target or "", USER_PATH_ENV: user_path,
                                  TRACE_ENV: "1" if args.trace else ""})
        package_root = str(Path(__file__).resolve().parent.parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tmp, package_root, user_path) if p)
        try:
            returncode = subprocess.call(command, env=env)
        except OSError as e:
            raise UsageError(f"record: cannot run {command[0]!r}: {e.strerror or e}") from None
        recorded = read_record(record)
    for error, count in sorted(recorded.errors.items()):
        print(f"not recorded: {error}" + (f" ({count} launches)" if count > 1 else ""), file=sys.stderr)
    if recorded.rows:
        write_plan(recorded.rows, output, command, target, recorded.roots)
    if args.trace and recorded.dispatches:
        write_record(args.trace, recorded.dispatches.values())
    line, ok = summary(recorded, output, target, returncode, Path(args.trace) if args.trace else None)
    print(line, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def summary(recorded, output: Path, target: str | None, returncode: int, trace: Path | None) -> tuple[str, bool]:
    """One line that says what the plan holds, what it lacks and why: (the line, whether all went well)."""
    where = f"dry run for {target}" if target else "on this GPU"
    refused = sum(recorded.errors.values())
    parts = []
    if recorded.rows:
        kernels = {r["kernel"] for r in recorded.rows}
        launches = len({json.dumps(r, sort_keys=True) for r in recorded.rows})
        parts.append(f"recorded {launches} launches of {len(kernels)} kernels ({where}) -> {output}")
    elif refused:
        parts.append(f"tritonwarm: no plan written: none of the program's launches could be recorded ({where})")
    else:
        parts.append(f"tritonwarm: the program launched no Triton kernel ({where}): no plan written")
    if refused:
        parts.append(f"{refused} launches not recorded (above)")
    if trace is not None:
        misses = sum(1 for d in recorded.dispatches.values() if not d["hit"])
        parts.append(f"dispatch record -> {trace}: {len(recorded.dispatches)} variants, {misses} not in Triton's cache"
                     if recorded.dispatches else "no dispatch record written")
    if returncode != 0:
        parts.append(f"the program exited with status {returncode}" +
                     (": the plan holds what it launched before" if recorded.rows else ""))
    return "; ".join(parts), bool(recorded.rows) and not refused and returncode == 0
