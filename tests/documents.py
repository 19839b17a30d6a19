"""The project's Markdown documents as the tests that check them read them: README.md, the
chapters under docs/, and the code blocks of a document."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["CHAPTERS", "DOCUMENTS", "README", "ROOT", "code_blocks"]

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: The chapters the README's Documentation list names: docs/*.md.
CHAPTERS = sorted((ROOT / "docs").glob("*.md"))
DOCUMENTS = [README, *CHAPTERS]

_BLOCK = re.compile(r"```[a-z]*\n(.*?)```", re.DOTALL)


def code_blocks(document: Path) -> list[str]:
    """The text of each fenced code block of `document`."""
    return _BLOCK.findall(document.read_text(encoding="utf-8"))
