"""The README's CLI synopsis against the parser: every command it shows exists, every flag it
shows is the command's, and every flag a command takes is shown (`--json` and `--help` aside:
the README says every read command takes `--json`). The commands docs/ shows are checked too:
each exists, with flags it takes."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from orchestrator.cli import build_parser
from tests.documents import DOCUMENTS, README, code_blocks

UNSHOWN = {"-h", "--help", "--json"}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _commands() -> dict[str, argparse.ArgumentParser]:
    """`tasks list` -> its parser, for every leaf command."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(prefix: str, parser: argparse.ArgumentParser) -> None:
        children = _subparsers(parser)
        if not children:
            found[prefix] = parser
        for name, child in children.items():
            walk(f"{prefix} {name}".strip(), child)

    walk("", build_parser())
    return found


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {
        option
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--")
    } - UNSHOWN


def _alternatives(usage: str) -> list[str]:
    """`db upgrade [REV] | db current` -> its commands; `a|b` or a `|` in brackets is a choice."""
    parts, depth, current = [], 0, ""
    for index, char in enumerate(usage):
        depth += {"[": 1, "(": 1, "]": -1, ")": -1}.get(char, 0)
        if usage[index - 1 : index + 2] == " | " and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return [*parts, current.strip()]


def _synopsis(document: Path = README) -> dict[str, set[str]]:
    """Each command the document's code blocks show (`orchestrator GROUP CMD ...`, and the
    `| CMD ...` alternatives after one), with the flags shown on it."""
    commands = _commands()
    shown: dict[str, set[str]] = {}
    for block in code_blocks(document):
        for line in block.splitlines():
            if not line.startswith("orchestrator "):
                continue
            usage = line.split("  #", 1)[0].removeprefix("orchestrator ")
            if usage.startswith("--"):  # the program's own flags (`orchestrator --version`)
                shown.setdefault("", set()).update(re.findall(r"--[a-z][a-z-]*", usage))
                continue
            group = ""
            for part in _alternatives(usage):
                words = part.split()
                name = " ".join(words[:2]) if " ".join(words[:2]) in commands else words[0]
                if name not in commands and group:
                    name = f"{group} {words[0]}"
                assert name in commands, (line, part)
                group = name.split()[0]
                flags = set(re.findall(r"--[a-z][a-z-]*", part)) - UNSHOWN
                shown.setdefault(name, set()).update(flags)
    return shown


def test_every_command_of_the_readme_exists_and_every_command_is_shown() -> None:
    assert sorted(_synopsis().keys() - {""}) == sorted(_commands())


def test_the_flags_the_readme_and_docs_show_are_the_commands_flags() -> None:
    commands = _commands() | {"": build_parser()}
    wrong = {
        (document.name, name): sorted(flags - _flags(commands[name]))
        for document in DOCUMENTS
        for name, flags in _synopsis(document).items()
        if flags - _flags(commands[name])
    }
    assert not wrong, wrong


def test_every_flag_of_a_command_is_shown_somewhere_in_the_readme() -> None:
    shown = _synopsis()
    missing = {
        name: sorted(_flags(parser) - shown.get(name, set()))
        for name, parser in (_commands() | {"": build_parser()}).items()
        if _flags(parser) - shown.get(name, set())
    }
    assert not missing, missing
