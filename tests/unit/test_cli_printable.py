"""`cli.common.printable`: what the CLI prints of a stored value cannot forge a line, drive the
terminal, or reorder and hide text on a terminal that renders bidirectional text."""

from __future__ import annotations

import pytest

from orchestrator.cli.common import printable


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("abc\u202edcba", "abc\\u202edcba"),  # right-to-left override
        ("a\u2066b\u2069c", "a\\u2066b\\u2069c"),  # isolates
        ("pay\u200bto", "pay\\u200bto"),  # zero-width space
        ("x\ufeffy", "x\\ufeffy"),
        ("line\nforged", "line\\nforged"),
        ("\x1b[31mred", "\\x1b[31mred"),
        ("浊度 4.1 NTU", "浊度 4.1 NTU"),  # ordinary text stays as it is
    ],
)
def test_controls_are_escaped_and_text_is_kept(raw: str, shown: str) -> None:
    assert printable(raw) == shown
