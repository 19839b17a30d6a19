"""A simulated SCADA source for the demo and the tests (origin `synthetic`, always).

Deterministic readings every 10 minutes for a few district meters: turbidity (NTU) and pressure
(bar). Each day the Riverside North meter shows a pressure dip at 06:10 and a turbidity peak of
4.1 NTU at 08:40, the brown-water story of the demo. Nothing here is a real measurement.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any, Final

__all__ = ["MEASURES", "POINTS", "STEP", "readings"]

STEP: Final = timedelta(minutes=10)
POINTS: Final = ("DM-RN-01", "DM-RN-02", "DM-HS-01")
MEASURES: Final = ("turbidity", "pressure")
_BASE: Final = {"turbidity": 0.4, "pressure": 3.2}


def readings(point: str, measure: str, start: datetime, end: datetime) -> list[dict[str, Any]]:
    """Readings of `point`/`measure` with start <= time < end, oldest first."""
    first = start.replace(second=0, microsecond=0)
    first -= timedelta(minutes=first.minute % 10)
    if first < start:
        first += STEP
    rows: list[dict[str, Any]] = []
    at = first
    while at < end:
        stamp = at.isoformat()  # once per reading: the row and the noise seed share it
        rows.append({"time": stamp, "point": point, "measure": measure,
                     "value": _value(point, measure, at, stamp)})  # fmt: skip
        at += STEP
    return rows


def _value(point: str, measure: str, at: datetime, stamp: str) -> float:
    noise = int(hashlib.sha256(f"{point}{measure}{stamp}".encode()).hexdigest()[:4], 16)
    value = _BASE[measure] + (noise / 0xFFFF - 0.5) * (0.1 if measure == "turbidity" else 0.2)
    if point == "DM-RN-01":
        minute = at.hour * 60 + at.minute
        if measure == "pressure" and minute == 6 * 60 + 10:
            value = 1.9
        if measure == "turbidity" and minute == 8 * 60 + 40:
            value = 4.1
    return round(value, 2)
