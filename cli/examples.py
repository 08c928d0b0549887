"""One example per command, shown at the end of its ``--help``; a test parses each one, so none drifts
from the arguments the command takes."""

from __future__ import annotations

import argparse

EXAMPLES: dict[str, str] = {
    "warmup": "tritonwarm warmup --target h100",
    "check": "tritonwarm check --target h100",
    "list": "tritonwarm list --kernel rms_norm",
    "show": "tritonwarm show 01c491499961 --ir ptx",
    "du": "tritonwarm du",
    "prune": "tritonwarm prune --other-environments --dry-run",
    "targets": "tritonwarm targets",
    "bundle": "tritonwarm bundle create warm-sm90.tar.gz --target sm90",
    "bundle create": "tritonwarm bundle create warm-sm90.tar.gz --target sm90",
    "bundle verify": "tritonwarm bundle verify warm-sm90.tar.gz --for serving.json",
    "bundle install": "tritonwarm bundle install warm-sm90.tar.gz --cache-dir /srv/triton-cache",
    "bundle sign": "tritonwarm bundle sign warm-sm90.tar.gz --key release.key",
    "bundle keygen": "tritonwarm bundle keygen release",
    "bundle merge": "tritonwarm bundle merge warm.tar.gz shard-1.tar.gz shard-2.tar.gz",
    "tune": "tritonwarm tune --target local",
    "record": "tritonwarm record -o plan.yaml --target sm90 -- python serve.py",
    "env": "tritonwarm env -o serving.json",
    "engine": "tritonwarm engine run --config tiny --dry-run --target sm90 --jit-policy error",
    "engine run": "tritonwarm engine run --config tiny --dry-run --target sm90 --jit-policy error",
}


def subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """``(path, parser, help)`` for every command and sub-command under ``parser``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield path + (name,), sub, helps.get(name)
                yield from subcommands(sub, path + (name,))


class _KeepExample:
    """The example keeps its lines; the description and argument help keep argparse's wrapping."""

    def _fill_text(self, text, width, indent):
        if text.startswith("example:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class _Formatter(_KeepExample, argparse.HelpFormatter):
    pass


class _DefaultsFormatter(_KeepExample, argparse.ArgumentDefaultsHelpFormatter):
    pass


def describe(parser: argparse.ArgumentParser) -> None:
    """Give every command a description (its one-line help, where it has none) and its example."""
    for path, sub, help_text in subcommands(parser):
        if not sub.description and help_text:
            sub.description = help_text[0].upper() + help_text[1:] + "."
        example = EXAMPLES.get(" ".join(path))
        if example and not sub.epilog:
            sub.epilog = f"example:\n  {example}"
        if sub.formatter_class is argparse.HelpFormatter:
            sub.formatter_class = _Formatter
        elif sub.formatter_class is argparse.ArgumentDefaultsHelpFormatter:
            sub.formatter_class = _DefaultsFormatter

