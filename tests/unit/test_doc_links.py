"""Every relative Markdown link of README.md and docs/ resolves: to a file that exists and, for a
`#anchor`, to a heading of that file under GitHub's rule (the chapters moved from the README to
docs/ and point at each other; a link left at its old `#anchor` leads nowhere)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.documents import CHAPTERS, ROOT

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
_CODE = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.DOTALL)
_LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.MULTILINE)


def documents(root: Path = ROOT) -> list[Path]:
    """README.md and every Markdown file under docs/."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def _prose(text: str) -> str:
    """The text without fenced blocks (whose lines are not Markdown) nor code spans."""
    return _CODE.sub("code", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, each space a `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a file's headings, a repeated one numbered as GitHub numbers it."""
    found: set[str] = set()
    for match in _HEADING.finditer(_FENCE.sub("", text)):
        base = slug(match.group(1))
        name, count = base, 0
        while name in found:
            count += 1
            name = f"{base}-{count}"
        found.add(name)
    return found


def broken_links(root: Path = ROOT) -> list[str]:
    """`file: target (why)` for each relative link that leads nowhere."""
    broken = []
    for document in documents(root):
        for target in _LINK.findall(_prose(document.read_text(encoding="utf-8"))):
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                continue  # https:, mailto:: not ours to check
            path, _, anchor = target.partition("#")
            linked = (document.parent / path).resolve() if path else document
            where = f"{document.relative_to(root)}: {target}"
            if not linked.is_file():
                broken.append(f"{where} (no such file)")
            elif (
                anchor
                and linked.suffix == ".md"
                and anchor not in anchors(linked.read_text(encoding="utf-8"))
            ):
                broken.append(f"{where} (no such heading in {linked.name})")
    return broken


def test_every_relative_link_of_the_readme_and_docs_resolves() -> None:
    assert broken_links() == []


def test_the_readme_links_to_every_chapter_of_docs() -> None:
    """The README's Documentation list names every file of docs/, so none is out of reach."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = set(_LINK.findall(_prose(readme)))
    chapters = {f"docs/{path.name}" for path in CHAPTERS}
    assert sorted(chapters - listed) == []


def test_github_anchors_drop_punctuation_and_number_repeats() -> None:
    assert slug("The worker fleet: pool, concurrency, restarts") == (
        "the-worker-fleet-pool-concurrency-restarts"
    )
    assert slug("Read-only sub-agents") == "read-only-sub-agents"
    assert slug("`ORCH_HOME` and the CLI's --json") == "orch_home-and-the-clis---json"
    text = "# A\n\n```\n# not a heading\n```\n\n## A\n\n## Lists (bench/list_pages.py)\n"
    assert anchors(text) == {"a", "a-1", "lists-benchlist_pagespy"}


def test_a_link_to_a_missing_file_or_heading_is_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "model.md").write_text("# The model\n\n## The scripted model\n")
    (tmp_path / "README.md").write_text(
        "See [the model](docs/model.md), [scripts](docs/model.md#the-scripted-model),\n"
        "[the\nconsole](docs/console.md), [budget](docs/model.md#context-budget),\n"
        "[people](#people-in-the-loop), [x](https://example.com/#nothing) and\n"
        "`[not a link](nowhere.md)`.\n\n```\n[not a link](nowhere.md)\n```\n"
    )
    assert broken_links(tmp_path) == [
        "README.md: docs/console.md (no such file)",
        "README.md: docs/model.md#context-budget (no such heading in model.md)",
        "README.md: #people-in-the-loop (no such heading in README.md)",
    ]
