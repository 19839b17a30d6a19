"""Reading a server-sent event stream's body in tests."""

from __future__ import annotations

import json
from typing import Any


def parse(text: str) -> list[dict[str, Any]]:
    """SSE messages as {"event", "id", "data"}; comments are skipped (a keep-alive is an
    event, `keepalive`)."""
    out = []
    for block in text.split("\n\n"):
        fields: dict[str, Any] = {}
        for line in block.splitlines():
            name, _, value = line.partition(": ")
            if name in ("event", "id", "data"):
                fields[name] = json.loads(value) if name == "data" else value
        if fields:
            out.append(fields)
    return out
