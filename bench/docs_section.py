"""docs/benchmarks.md holds one marked section per benchmark; each run replaces only its own."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DOC", "write_section"]

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def write_section(name: str, section: str, doc: Path = DOC) -> None:
    """Put `section` between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`; others stay."""
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{begin}\n{section.rstrip(chr(10))}\n{end}\n"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        text = head + block + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
