"""The bundled demo: a water-quality complaint task and the script its agent follows."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DEMO_CONTEXT", "DEMO_TASK_TYPE", "SCRIPTS"]

SCRIPTS = Path(__file__).parent / "scripts"
DEMO_TASK_TYPE = "water_quality_complaint"
DEMO_CONTEXT = {
    "complaint_id": "WQ-2026-1202-017",
    "district": "Riverside North",
    "report": "brown water from the kitchen tap since this morning",
    "address": "12 Mill Lane",
}
