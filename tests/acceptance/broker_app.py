"""A Celery app with the fleet's broker configuration and one probe task, for Redis restarts.

The worker under test runs `celery -A tests.acceptance.broker_app worker`: the same
`make_celery` settings and Redis transport as `orchestrator worker`, without the store, so
that only the broker connection is under test. The probe writes `<n>.started` and `<n>.done`
into `PROBE_FOLDER`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from orchestrator.settings import get_settings
from workers.celery_app import make_celery

__all__ = ["app", "probe"]

app = make_celery(get_settings())


@app.task(name="tests.probe")
def probe(number: int, seconds: float) -> None:
    folder = Path(os.environ["PROBE_FOLDER"])
    (folder / f"{number}.started").touch()
    time.sleep(seconds)
    (folder / f"{number}.done").touch()
