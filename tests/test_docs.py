"""The documents cannot drift from the code: the README's Python example and every Python block in
``docs/`` marked ``<!-- runnable -->`` run as written; every ``tritonwarm ...`` command they show
parses with the CLI's own parser (and names known targets); every relative link resolves; the README
stays a short guide whose Set-up block CI can read.

Conventions (docs/testing.md): commands in ``bash``/``sh``/``console``/``dockerfile`` blocks (or blocks
with no language) are parsed in full. An inline ``tritonwarm ...`` span is parsed in full too, unless it
is a synopsis (it holds ``[``, ``|`` or ``...``): then its subcommands must exist and every option it
names must be one of theirs; a span of subcommand words alone (``tritonwarm bundle install``) must
name an existing command."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console", "dockerfile"}
RUNNABLE = "<!-- runnable -->"
MAX_README_LINES = 400
MAX_CELL = 200


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def fenced_blocks(path: Path):
    """``(info string, first line number, lines, the closest non-blank line before the fence)``."""
    lines = path.read_text(encoding="utf-8").split("\n")
    i, before = 0, ""
    while i < len(lines):
        fence = re.match(r"^(\s*)(```+)\s*([^`\s]*)", lines[i])
        if not fence:
            if lines[i].strip():
                before = lines[i].strip()
            i += 1
            continue
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence.group(2)):
            body.append(lines[i])
            i += 1
        yield fence.group(3).lower(), start + 1, body, before
        i += 1
        before = ""


def prose(path: Path) -> str:
    """The page without its fenced blocks (inline code spans stay)."""
    out, inside = [], False
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.lstrip().startswith("```"):
            inside = not inside
            out.append("")
            continue
        out.append("" if inside else line)
    return "\n".join(out)


# ----------------------------------------------------------------------------- Python examples


def _run_python(source: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = tmp_path / "example.py"
    script.write_text(source, encoding="utf-8")
    env = dict(os.environ)  # the per-process test caches of conftest, never the user's
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT.parent), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)


def test_readme_python_example_runs_as_written(tmp_path):
    blocks = [body for lang, _, body, _ in fenced_blocks(README) if lang == "python"]
    assert blocks, "README.md has no ```python block"
    done = _run_python("\n".join(blocks[0]) + "\n", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torch.Size([4, 1408])" in done.stdout  # what its comment promises


def runnable_blocks():
    for path in DOCS:
        for lang, line, body, before in fenced_blocks(path):
            if before == RUNNABLE:
                assert lang == "python", f"{_name(path)}:{line}: only ```python blocks can be marked runnable"
                yield pytest.param("\n".join(body) + "\n", id=f"{_name(path)}:{line}")


@pytest.mark.parametrize("source", list(runnable_blocks()))
def test_runnable_docs_examples_run(source, tmp_path):
    done = _run_python(source, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]


def test_some_docs_examples_are_runnable():
    assert len(list(runnable_blocks())) >= 2


# ----------------------------------------------------------------------------- commands


def _parser() -> argparse.ArgumentParser:
    from tritonwarm.cli import _parser as build  # builds it, runs nothing

    return build()


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def _commands_in_line(line: str) -> list[list[str]]:
    """Each ``tritonwarm`` invocation in one shell line, as its arguments."""
    stripped = line.strip()
    if re.match(r"^(CMD|ENTRYPOINT)\s*\[", stripped):  # a Dockerfile's exec form
        words = json.loads(stripped.split(None, 1)[1])
        return [words[1:]] if words and words[0] == "tritonwarm" else []
    stripped = re.sub(r"^(RUN|\$)\s+", "", stripped)
    lexer = shlex.shlex(stripped, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, current = [], []
    for token in [*lexer, ";"]:
        if token and set(token) <= set("();<>|&"):
            commands.append(current)
            current = []
        else:
            current.append(token)
    found = []
    for words in commands:
        while words and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]) or words[0] in ("env", "exec", "sudo")):
            words = words[1:]
        if words[:1] == ["tritonwarm"]:
            found.append(words[1:])
        elif len(words) >= 3 and words[0].startswith("python") and words[1:3] == ["-m", "tritonwarm"]:
            found.append(words[3:])
    return found


def command_lines():
    """``(page:line, arguments, kind)`` for every documented invocation; kind is ``full``,
    ``synopsis`` or ``name``."""
    for path in PAGES:
        for lang, start, body, _ in fenced_blocks(path):
            if lang not in SHELL_BLOCKS:
                continue
            joined, first = "", None
            for offset, line in enumerate(body):
                first = start + offset if first is None else first
                if line.rstrip().endswith("\\"):
                    joined += line.rstrip()[:-1] + " "
                    continue
                joined += line
                if "tritonwarm" in joined:
                    for args in _commands_in_line(joined):
                        yield pytest.param(args, "full", id=f"{_name(path)}:{first}:{' '.join(args)[:60]}")
                joined, first = "", None
        text = prose(path)
        for match in re.finditer(r"`(?:python -m )?tritonwarm ([^`]+)`", text):
            line = text.count("\n", 0, match.start()) + 1
            span = match.group(1)
            kind = "synopsis" if re.search(r"\[|\||\.\.\.|…", span) else "full"
            words = span.split()
            if kind == "full" and all(re.fullmatch(r"[a-z][a-z-]*", w) for w in words):
                kind = "name"
            yield pytest.param(words if kind != "full" else shlex.split(span), kind,
                               id=f"{_name(path)}:{line}:{span[:60]}")


def _parse(parser: argparse.ArgumentParser, args: list[str]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            return parser.parse_args(args), ""
        except SystemExit as e:
            return None, "" if e.code == 0 else err.getvalue().strip().splitlines()[-1]


def _leaf(parser: argparse.ArgumentParser, words: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The subcommand the leading words name, and the words after them."""
    while words and _subcommands(parser).get(words[0]) is not None:
        parser, words = _subcommands(parser)[words[0]], words[1:]
    return parser, words


def _check_targets(namespace) -> str:
    from tritonwarm.jit.core.targets import resolve_targets

    value = getattr(namespace, "target", None)
    if not value or value == "local" or not re.fullmatch(r"[a-z0-9,]+", value):  # T, T[,T...]: placeholders
        return ""
    try:
        resolve_targets(value)
    except Exception as e:  # noqa: BLE001 (the message is the finding)
        return str(e)
    return ""


@pytest.mark.parametrize("args, kind", list(command_lines()))
def test_documented_commands_parse(args, kind):
    parser = _parser()
    if kind == "full":
        namespace, error = _parse(parser, args)
        assert not error, f"tritonwarm {shlex.join(args)}: {error}"
        if namespace is not None:
            assert not (problem := _check_targets(namespace)), f"tritonwarm {shlex.join(args)}: {problem}"
        return
    leaf, rest = _leaf(parser, args)
    assert leaf is not parser, f"tritonwarm {' '.join(args)}: no such command"
    if kind == "name":
        assert not rest, f"tritonwarm {' '.join(args)}: {rest[0]!r} is not a subcommand"
        return
    known = set(leaf._option_string_actions)
    for word in rest:
        for option in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", word):
            assert option in known, f"tritonwarm {' '.join(args)}: {option} is not an option of this command"


def _options_and_positionals(leaf: argparse.ArgumentParser, words: list[str]):
    """``(option chunks, positional words)`` of a command's words after its subcommands, or None where
    the order of the words is not free (a ``-- COMMAND`` remainder, an option of a variable count)."""
    if "--" in words or any(a.nargs == argparse.REMAINDER for a in leaf._actions):
        return None
    chunks, positionals, i = [], [], 0
    while i < len(words):
        word = words[i]
        if not word.startswith("-") or word == "-":
            positionals.append(word)
            i += 1
            continue
        action = leaf._option_string_actions.get(word.split("=", 1)[0])
        if action is None or action.nargs in ("?", "*", "+"):
            return None
        takes = 0 if "=" in word else 1 if action.nargs is None else action.nargs
        chunks.append(words[i:i + 1 + takes])
        i += 1 + takes
    return chunks, positionals


def test_documented_commands_parse_in_any_order():
    """Positionals may come before, between or after options: each documented command, with its
    positionals moved after its options, before them and between them, parses to the same namespace."""
    parser, moved = _parser(), 0
    commands = [p.values[0] for p in command_lines() if p.values[1] == "full"]
    commands.append(["bundle", "create", "OUT", "--engine-config", "deepseek-v2-lite", "warmup_specs/"])
    for args in commands:
        namespace, error = _parse(parser, args)
        leaf, rest = _leaf(parser, args)
        split = _options_and_positionals(leaf, rest)
        if namespace is None or error or split is None:
            continue
        chunks, positionals = split
        subcommands = args[:len(args) - len(rest)]
        interleaved = [word for i in range(max(len(chunks), len(positionals)))
                       for word in [*positionals[i:i + 1], *(chunks[i] if i < len(chunks) else [])]]
        for order in (sum(chunks, []) + positionals, positionals + sum(chunks, []), interleaved):
            reordered = [*subcommands, *order]
            again, error = _parse(parser, reordered)
            assert not error, f"tritonwarm {shlex.join(reordered)} (reordered from {shlex.join(args)}): {error}"
            assert vars(again) == vars(namespace), f"tritonwarm {shlex.join(reordered)}"
            moved += reordered != args
    assert moved >= 10  # the examples do have positionals to move


def test_commands_are_found():
    kinds = [p.values[1] for p in command_lines()]
    assert kinds.count("full") >= 20 and kinds.count("synopsis") >= 5 and kinds.count("name") >= 5


# ----------------------------------------------------------------------------- links and shape


def _slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in prose(path).split("\n"):
        heading = re.match(r"^#{1,6}\s+(.*)", line)
        if heading:
            slug = _slug(heading.group(1))
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def links():
    for path in PAGES:
        text = re.sub(r"`[^`\n]*`", "", prose(path))  # code spans hold no links: kernel[grid](...)
        for match in re.finditer(r"\]\(([^)\s]+)\)", text):
            target = match.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            line = text.count("\n", 0, match.start()) + 1
            yield pytest.param(path, target, id=f"{_name(path)}:{line}:{target}")


@pytest.mark.parametrize("page, target", list(links()))
def test_relative_links_resolve(page, target):
    file_part, _, anchor = target.partition("#")
    destination = (page.parent / file_part).resolve() if file_part else page
    assert destination.exists(), f"{_name(page)}: {target}: no such file"
    if anchor and destination.suffix == ".md":
        assert anchor in _anchors(destination), f"{_name(page)}: {target}: no such heading"


def test_readme_is_a_short_guide():
    lines = README.read_text(encoding="utf-8").split("\n")
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines"


def test_readme_set_up_block_is_two_commands():
    """What ``.ci/run`` reads: the first ```bash block after the ``## Set-up`` heading, one command a line."""
    lines = README.read_text(encoding="utf-8").split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("## Set-up"))
    fence = next(i for i in range(start, len(lines)) if lines[i].startswith("```bash"))
    end = next(i for i in range(fence + 1, len(lines)) if lines[i].startswith("```"))
    commands = lines[fence + 1:end]
    assert len(commands) == 2 and all(c.strip() for c in commands), commands
    assert "pytest" in commands[1]


def test_no_long_table_cells():
    long = [f"{_name(path)}:{n}: {len(cell)} characters"
            for path in PAGES
            for n, line in enumerate(prose(path).split("\n"), 1) if line.startswith("|")
            for cell in line.strip().strip("|").split(" | ") if len(cell.strip()) > MAX_CELL]
    assert not long, long


def test_triton_version_marker_names_test_files(pytestconfig):
    """A renamed test file must not silently leave the second Triton's pass."""
    (names,) = [plugin.TRITON_VERSION_FILES for plugin in pytestconfig.pluginmanager.get_plugins()
                if hasattr(plugin, "TRITON_VERSION_FILES")]
    missing = {name for name in names if not (ROOT / "tests" / name).is_file()}
    assert names and not missing, missing
