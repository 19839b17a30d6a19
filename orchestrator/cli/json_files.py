"""A JSON object an operator gives in a file (`tasks trigger --context-file` and
`--sample-input-file`), read strictly: anything not an object, or holding what no store keeps (a
number that is not finite, a NUL character, an unpaired surrogate), is one line and exit code 2,
before any write."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from orchestrator.cli.common import CommandFailed

__all__ = ["json_object_file"]


class _NotFinite(ValueError):
    pass


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses as infinity
        raise _NotFinite(text)
    return value


def _constant(name: str) -> float:
    raise _NotFinite(name)  # NaN, Infinity, -Infinity: not JSON, and no store keeps them


def _bad_text(value: Any, where: str = "") -> str | None:
    """Where a NUL character or an unpaired surrogate hides in `value`, or None."""
    if isinstance(value, str):
        if "\x00" in value:
            return f"a NUL character (\\u0000) at {where or 'the top'}"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"an unpaired surrogate (not UTF-8) at {where or 'the top'}"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            shown = _printable(key)
            at = f"{where}.{shown}" if where else shown
            found = _bad_text(key, f"the key {at}") or _bad_text(item, at)
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _bad_text(item, f"{where}[{index}]")
            if found:
                return found
    return None


def _printable(key: str) -> str:
    """A key as one printable line, whatever it holds (newlines, NUL, a lone surrogate)."""
    escaped = json.dumps(key, ensure_ascii=False)[1:-1]
    return escaped.encode("utf-8", "backslashreplace").decode("utf-8")[:60]


def json_object_file(path: Path | None, what: str) -> dict[str, Any] | None:
    """The JSON object in `path`; anything else is one line and exit code 2, before any write."""
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CommandFailed(f"cannot read {what} {path}: {exc.strerror}", exit_code=2) from None
    except UnicodeDecodeError:
        raise CommandFailed(f"{what} {path} is not UTF-8 text", exit_code=2) from None
    try:
        value = json.loads(text, parse_constant=_constant, parse_float=_finite)
    except _NotFinite as exc:
        raise CommandFailed(
            f"{what} {path} holds the number {exc}: only finite numbers are allowed", exit_code=2
        ) from None
    except json.JSONDecodeError as exc:
        raise CommandFailed(f"{what} {path} is not JSON: {exc}", exit_code=2) from None
    except ValueError as exc:  # e.g. an integer longer than Python converts
        raise CommandFailed(f"{what} {path} is not usable JSON: {exc}", exit_code=2) from None
    except RecursionError:
        raise CommandFailed(f"{what} {path} is nested too deeply", exit_code=2) from None
    if not isinstance(value, dict):
        raise CommandFailed(
            f"{what} {path} must hold a JSON object, not {_json_kind(value)}", exit_code=2
        )
    try:
        found = _bad_text(value)
    except RecursionError:
        raise CommandFailed(f"{what} {path} is nested too deeply", exit_code=2) from None
    if found:
        raise CommandFailed(f"{what} {path} holds {found}: not allowed", exit_code=2)
    return value


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return "a number"
