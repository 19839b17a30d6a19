"""The README's settings table against the settings the code reads: every one documented once,
nothing documented that is not read, and each documented default the code's."""

from __future__ import annotations

import re
from typing import Any

from orchestrator.settings import Settings, _env_name, setting_names
from tests.documents import README


def _rows() -> list[tuple[list[str], list[str]]]:
    """(names, defaults) of each row of the table under `## Settings`."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`([A-Z][A-Z0-9_]+)`", cells[0])
        defaults = [part.strip() for part in cells[1].split(" / ")]
        rows.append((names, defaults))
    return rows


def test_every_setting_is_documented_once_and_nothing_else() -> None:
    documented = [name for names, _ in _rows() for name in names]
    duplicates = sorted({name for name in documented if documented.count(name) > 1})
    assert not duplicates, duplicates
    assert sorted(documented) == sorted(setting_names())


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_documented_defaults_are_the_codes() -> None:
    by_env = {_env_name(field): info.default for field, info in Settings.model_fields.items()}
    wrong = []
    for names, defaults in _rows():
        if len(defaults) != len(names):
            defaults = defaults[:1] * len(names)
        for name, default in zip(names, defaults, strict=True):
            literal = re.fullmatch(r"`([^`]*)`(?: \(off\))?", default)
            if literal is None:
                continue  # "unset", "unset (embedded)", prose: checked by reading
            if by_env[name] is None or _shown(by_env[name]) != literal.group(1):
                wrong.append((name, literal.group(1), by_env[name]))
    assert not wrong, wrong
