"""The ``tritonwarm`` command: argument parsing and printing only; the work is in ``tritonwarm.jit``.

Exit codes: 0 ok, 1 a check found a problem, 2 bad input (one line on stderr, no traceback;
set ``TRITONWARM_DEBUG=1`` to see one).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from ..errors import describe_error
from .common import SHIPPED_SPECS, UsageError


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from .. import output

    output.new_command()
    fp_fusion_note = _fp_fusion_warning_once(args)
    if fp_fusion_note:  # said once the input is read (never beside a one-line error), before the result
        output.note_later(fp_fusion_note, per_folder=True)
    from ..jit.pipeline.progress import heartbeat

    try:
        with heartbeat("tritonwarm " + getattr(args.func, "__name__", "").removeprefix("cmd_").replace("_", " ")):
            rc = args.func(args)
        output.notes_now()  # where a command did not say them before its result
        return rc
    except KeyboardInterrupt:
        print("tritonwarm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `tritonwarm list | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # every error a user can cause ends here, as one line
        output.drop_notes()
        if os.environ.get("TRITONWARM_DEBUG"):
            traceback.print_exc()
        print(f"tritonwarm: error: {_one_line(e)}", file=sys.stderr)
        return 2


FP_FUSION_NOTE = ("TRITON_DEFAULT_FP_FUSION is unset: Triton {version} fuses (its default until 3.10) and warns; "
                  "the value enters every key: set it identically when warming and serving")


def _fp_fusion_warning_once(args) -> str | None:
    """Triton 3.9 warns of its FP-fusion default change once per process: once in every worker of a
    warm-up, in several lines. Silence it here (the workers, forked after this, inherit it as given
    already) and return the one line to say instead, where the command keys or compiles."""
    if os.environ.get("TRITON_DEFAULT_FP_FUSION") is not None or os.environ.get("TRITON_INTERPRET") == "1":
        return None
    try:
        from triton._utils import FP_FUSION_DEFAULT_WARNING, warn_once
    except ImportError:  # a Triton that does not warn
        return None
    import warnings

    import triton

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warn_once(FP_FUSION_DEFAULT_WARNING)  # remembered by Triton as given: it gives it no more
    if getattr(args, "specs", None) is not None or getattr(args, "config", None) is not None:
        return FP_FUSION_NOTE.format(version=triton.__version__)
    return None


def _one_line(e: Exception) -> str:
    """The error's own message on one line; its type only where the message says too little."""
    return describe_error(e)


class ArgumentsAnywhere(argparse.ArgumentParser):
    """A parser whose positionals may come before, between or after its options
    (``bundle create OUT --target sm90 warmup_specs/``), as with argparse's intermixed parsing.

    Subcommands are parsers of this class too (argparse makes them of their parent's class). A parser
    that has subcommands or takes a ``-- COMMAND`` remainder cannot be parsed intermixed (argparse
    refuses it): it parses as usual, and its subcommand's own parser intermixes."""

    _intermixing = False

    def parse_known_args(self, args=None, namespace=None):
        if self._intermixing or any(a.nargs in (argparse.PARSER, argparse.REMAINDER)
                                    for a in self._get_positional_actions()):
            return super().parse_known_args(args, namespace)
        self._intermixing = True  # intermixed parsing calls parse_known_args itself (Python <= 3.12)
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def _parser() -> argparse.ArgumentParser:
    """Every command's arguments. Only light modules are imported here: ``--help`` and argument
    errors never pay for torch, Triton or the engine (each command imports what it needs)."""
    from .. import __version__
    from ..engine.cli import add_engine_parser
    from . import bundle, cache, env, record, tune, warm
    from .examples import describe

    p = ArgumentsAnywhere(prog="tritonwarm", description="Warm Triton's compile cache ahead of time.")
    p.add_argument("--version", action="version", version=f"tritonwarm {__version__}")
    sub = p.add_subparsers(metavar="COMMAND")
    warm.add_parsers(sub)
    cache.add_parsers(sub)
    bundle.add_parsers(sub)
    tune.add_parsers(sub)
    record.add_parsers(sub)
    env.add_parsers(sub)
    add_engine_parser(sub)
    describe(p)
    return p


__all__ = ["main", "UsageError", "SHIPPED_SPECS"]
