"""Values every store keeps alike: Postgres refuses a NUL character in text and jsonb, NaN and
infinity in jsonb, and text that is not UTF-8 (an unpaired surrogate); SQLite would keep them for
a worker or a reader to trip on. Request models refuse them up front, as a 422 naming the field
(the API) or one line naming the option (the CLI), through `StoredText` and `FilledText`.
"""

from __future__ import annotations

import math
import unicodedata
from typing import Annotated, Any, Final

from pydantic import AfterValidator, StringConstraints

__all__ = [
    "MAX_JSON_DEPTH",
    "NAME_MAX",
    "FilledText",
    "Name",
    "StoredText",
    "filled_text",
    "storable_json",
    "storable_text",
]

#: How deep free-form JSON (a trigger's context or sample input) may nest, objects and arrays:
#: deeper is no task's data, and exhausts the recursion of the code that copies and renders it.
MAX_JSON_DEPTH = 64


def storable_text(text: str) -> str:
    """`text` unchanged, or ValueError (a pydantic validator's refusal) saying what is wrong."""
    if "\x00" in text:
        raise ValueError("a NUL character (\\u0000) cannot be stored")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("an unpaired surrogate is not UTF-8 and cannot be stored") from None
    return text


def filled_text(text: str) -> str:
    """`storable_text` that says something: a required title, reason or name of blanks only
    is refused like an empty one. Invisible characters count as blanks: zero-width spaces and
    bidi controls (Unicode format characters) alone would record evidence nobody can read, or
    a name that shows as nobody."""
    if not any(_visible(char) for char in storable_text(text)):
        raise ValueError("must not be blank")
    return text


#: Free text of a request body (a reason, a note, a question, who acted): refused with a 422
#: naming the field when no store keeps it (a NUL character), before any work is spent on it.
#: Here, with pydantic only, not in the API's contract: the CLI checks its options with the
#: API's body models, and `orchestrator.api` builds the FastAPI app when imported.
StoredText = Annotated[str, AfterValidator(storable_text)]
#: StoredText that is required: blanks alone are refused like nothing (a reason, who acted).
#: An optional one with a length limit names the limit before the check, `Annotated[str,
#: StringConstraints(max_length=N), AfterValidator(filled_text)] | None`: a `max_length` on the
#: field of a `FilledText | None` is measured around the union, after the check, and refused
#: in pydantic's words for a list ("Value should have at most 200 items after validation"),
#: where the limit before says "String should have at most 200 characters", as for a required
#: text (tests/unit/test_text_limits.py holds every request body to it).
FilledText = Annotated[str, AfterValidator(filled_text)]

#: The most characters of who did a thing (`by`): an operator account's name
#: (`orchestrator.operators`), which is the `by` of every request an account sends, and of a
#: `--by` or a body's `by` under the shared token. One limit for every command that records
#: one (a requeue, a cancel, a decision, a person's step, a write's resolution, a delivery's
#: retry or discard); every column that keeps one is at least this wide.
NAME_MAX: Final = 128
#: Who did a thing, in a request body (the CLI's `--by` is checked by the same models). The
#: limits before the check, as for an optional `FilledText` above: an empty name is said as a
#: length, blanks only as blank.
Name = Annotated[
    str, StringConstraints(min_length=1, max_length=NAME_MAX), AfterValidator(filled_text)
]


def _visible(char: str) -> bool:
    return not char.isspace() and unicodedata.category(char) not in ("Cf", "Cc")


def storable_json(value: dict[str, Any]) -> dict[str, Any]:
    """`value` unchanged when every store keeps it: text without NUL or unpaired surrogates,
    finite numbers, at most MAX_JSON_DEPTH levels; walked without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(item, dict):
                for key in item:
                    storable_text(key)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
        elif isinstance(item, str):
            storable_text(item)
        elif isinstance(item, float) and not math.isfinite(item):
            raise ValueError("numbers must be finite (no NaN or Infinity)")
    return value
