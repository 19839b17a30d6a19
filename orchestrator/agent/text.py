"""Text the store, the token counter and the wire can all hold.

JSON legally carries NUL (`\\u0000`) and lone surrogates (`\\ud800`): a model may answer with
them, a business API or a command may return them. Postgres refuses NUL in text and JSON, and a
lone surrogate is not UTF-8 (the token counter, SQLite and the request encoder refuse it), so a
round that met one stopped. They are replaced by U+FFFD where such text enters the runtime.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["REPLACEMENT", "clean", "clean_json", "clean_text", "storable_json"]

REPLACEMENT = "\ufffd"


def clean_text(text: str) -> str:
    """`text` with NUL and lone surrogates replaced by U+FFFD (the same object when clean)."""
    if "\x00" in text:
        text = text.replace("\x00", REPLACEMENT)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Surrogate pairs join; a lone surrogate becomes U+FFFD.
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def clean(value: Any) -> Any:
    """`value` (parsed JSON) with `clean_text` applied to every string, keys included; the
    same object when nothing needs replacing (a value is walked only if it needs it)."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict | list | tuple):
        return clean_json(value)[0]
    return value


def clean_json(value: Any) -> tuple[Any, str | None]:
    """`clean(value)` and its JSON text (`json.dumps(..., ensure_ascii=False)`), or None for
    the text of a value JSON cannot write. One serialisation in C tells whether anything needs
    replacing, where a walk in Python costs about ten times as much on a tool's result, and
    the text it wrote is kept for whoever stores the value: NUL is written `\\u0000` (as is
    the text of a backslash before `u0000`, which is walked for nothing), a lone surrogate is
    kept and refused by the UTF-8 encoder."""
    try:
        text = json.dumps(value, ensure_ascii=False, check_circular=False)
    except (TypeError, ValueError, RecursionError):
        return _clean(value), None  # not plain JSON: walk it
    if storable_json(text):
        return value, text
    cleaned = _clean(value)
    return cleaned, json.dumps(cleaned, ensure_ascii=False)


def storable_json(text: str) -> bool:
    """Can JSON text written by `json.dumps(..., ensure_ascii=False)` be stored as it is: no
    NUL in it (written `\\u0000`; the text of a backslash before `u0000` answers no too) and no
    lone surrogate (kept as it is by the writer, refused by the UTF-8 encoder)?"""
    return "\\u0000" not in text and (text.isascii() or _encodes(text))


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {
            clean_text(key) if isinstance(key, str) else key: _clean(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [_clean(item) for item in value]
    return value
