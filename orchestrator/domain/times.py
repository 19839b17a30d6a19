"""The one text form of a time the orchestrator sends: `wire_time`.

`datetime.isoformat()` leaves the fraction out when the microseconds are zero, so one API sent
`...:05+00:00` beside `...:05.123456+00:00`: two widths, and a client that cuts or sorts the
text, or parses it with a fixed format, trips on the rarer one. Every time that leaves the
process as text (API responses, the task stream, webhook bodies, the CLI's `--json`, times a
producer writes into a stored JSON payload) goes through `wire_time`.
"""

from __future__ import annotations

from datetime import datetime

__all__ = ["wire_time"]


def wire_time(moment: datetime) -> str:
    """`moment` as RFC 3339 text with six fraction digits always (`...:05.000000+00:00`)."""
    return moment.isoformat(timespec="microseconds")
