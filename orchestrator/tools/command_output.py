"""A command's output file: read as text, previewed and paged for the model, deleted.

The child writes straight into a temporary file (no reader threads to leak); these are the only
ways the tool looks at that file.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["PREVIEW", "READ_LIMIT", "delete_output", "output_page", "output_preview", "read_output"]

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


def read_output(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:  # deleted by `reap` meanwhile, or from outside
        return ""


def delete_output(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
