"""Canonical JSON and SHA-256 fingerprints of tool arguments (seed 000, durable receipts).

Two calls mean the same intent when their canonical arguments are equal: sorted keys, compact
separators, UTF-8, no NaN or infinity (a NaN is not equal to itself, so it cannot name an intent).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "NonCanonical",
    "canonical_json",
    "fingerprint",
    "identity_key",
    "refuse_non_finite",
]

_KEY_PARTS_SEPARATOR = "\x1f"  # unit separator: cannot occur in ids the host builds keys from


class NonCanonical(ValueError):
    """The value has no canonical JSON form (NaN, infinity, a non-string key, an unknown type)."""


def refuse_non_finite(value: Any, path: str = "$") -> None:
    """Raise `NonCanonical` if a float anywhere in `value` is NaN or infinite.

    Checked on the Python form before any JSON dump, because pydantic's JSON mode turns NaN into
    `null` and two different intents would then share one fingerprint.
    """
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NonCanonical(f"{path}: {value!r} has no canonical JSON form")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            refuse_non_finite(item, f"{path}.{key}")
    elif isinstance(value, list | tuple | set | frozenset):
        for index, item in enumerate(value):
            refuse_non_finite(item, f"{path}[{index}]")


def canonical_json(value: Any) -> str:
    """The canonical text of a JSON value: sorted keys, `,`/`:` separators, no ASCII escaping."""
    try:
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        # The walk in Python only when the C encoder refused: a value it wrote holds no NaN or
        # infinity (`allow_nan=False`), and one it refused is named by its path when it has.
        refuse_non_finite(value)
        raise NonCanonical(str(exc)) from None


def fingerprint(value: Any) -> str:
    """SHA-256 (hex, 64 characters) of the UTF-8 canonical JSON of `value`."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def identity_key(kind: str, *parts: str) -> str:
    """A fixed-length identity `kind:<sha256>` for a receipt.

    Hashing keeps the key inside the column whatever the lengths of session ids, round ids, tool
    names or call ids, and keeps those raw values out of the unique index.
    """
    if not kind or ":" in kind:
        raise ValueError("identity kind must be a non-empty word without ':'")
    joined = _KEY_PARTS_SEPARATOR.join(parts)
    return f"{kind}:{hashlib.sha256(joined.encode('utf-8')).hexdigest()}"


def same_json_value(first: Any, second: Any) -> bool:
    """Equal as JSON values. JSON has one number type, so 7 and 7.0 are one value: a backend
    written in JavaScript or Go answers 7 for the 7.0 it was sent. Not for digests, which keep
    the text that was sent (an intent's identity must not change under stored receipts)."""
    return canonical_json(_one_number_form(first)) == canonical_json(_one_number_form(second))


def _one_number_form(value: Any) -> Any:
    """`value` with every float that equals an integer as that integer (-0.0 as 0)."""
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, Mapping):
        return {key: _one_number_form(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_one_number_form(item) for item in value]
    return value
