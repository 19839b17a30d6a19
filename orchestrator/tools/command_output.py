"""A command's output file: read as text, previewed and paged for the model, deleted.

The child writes straight into a temporary file (no reader threads to leak); these are the only
ways the tool looks at that file. The file is read whole with the configured secrets masked
(`read_output`) before it is previewed or paged: a page's offsets count the masked text, so a
secret cut by a preview's gap or a page's end is not shown in part either (the host masks
every result, but only what it is given).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

from orchestrator.logs import distinctive

__all__ = [
    "MASKED_OUTPUT",
    "PREVIEW",
    "READ_LIMIT",
    "delete_output",
    "output_page",
    "output_preview",
    "read_output",
]

#: Said beside an output in which a configured secret was masked (the model reads `***`).
MASKED_OUTPUT = (
    "a configured secret (an API key, token or password of this deployment) in the output was "
    "replaced by ***; it is neither shown to you nor kept"
)
PREVIEW = 3000  # with the other fields, the JSON stays under the host preview size
READ_LIMIT = 16000


def output_preview(text: str) -> str:
    if len(text) <= PREVIEW:
        return text
    return text[: PREVIEW // 2] + "\n[...]\n" + text[-PREVIEW // 2 :]


def output_page(text: str, offset: int) -> tuple[str, int | None]:
    page = text[offset : offset + READ_LIMIT]
    end = offset + len(page)
    return page, (end if end < len(text) else None)


def read_output(path: str, secrets: Iterable[str] = ()) -> tuple[str, bool]:
    """The whole output as text, each of `secrets` that cannot be a word
    (`orchestrator.logs.distinctive`) as `***`, and whether one was."""
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:  # deleted by `reap` meanwhile, or from outside
        return "", False
    masked = False
    for secret in secrets:
        if distinctive(secret) and secret in text:
            text = text.replace(secret, "***")
            masked = True
    return text, masked


def delete_output(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
