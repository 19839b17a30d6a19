"""What response models share with no web framework: the time every answer sends (`IsoTime`)
and what `dispatched` means. Pydantic only: the CLI prints the API's views (`tasks show`,
`plans show`, `tasks node --json`) with these models, and `contract`, which re-exports them,
imports FastAPI.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import PlainSerializer, WithJsonSchema

from orchestrator.domain.times import wire_time

__all__ = ["WAKE_UP_DISPATCHED", "IsoTime"]

#: Every time a response model sends: `wire_time` (`...:05.000000+00:00`, six fraction digits
#: always), the form of the signed webhook bodies, the evidence citations, the task stream and
#: the CLI's `--json`, so a client never sees one instant written two ways or two widths;
#: documented as an RFC 3339 date-time. A plain `datetime` field would go out in pydantic's
#: `...Z` form (tests/unit/test_api_times.py refuses one in any route's response model).
IsoTime = Annotated[
    datetime,
    PlainSerializer(wire_time, return_type=str),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]


#: `dispatched` on the answer of a change that may queue a generation (a decision, a person's
#: step, a resolution): as the trigger's, and null when the change queued none.
WAKE_UP_DISPATCHED = (
    "false when the broker did not take the wake-up of the generation this change queued "
    "(Redis down): the change is committed all the same, and the sweeper sends the wake-up at "
    "its first sweep once the broker takes messages again (the CLI says so in a line); null "
    "when the change queued no generation"
)
