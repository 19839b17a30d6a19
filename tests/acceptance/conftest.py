"""What the fleet tests share: the test's own runtime on the fleet's store and broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.runtime import Runtime
from tests.acceptance.fleet import celery_runtime


@pytest.fixture
def rt(pg_url: str, redis_url: str, scripts: Path) -> Iterator[Runtime]:
    """Triggers, reads and operator commands, publishing wake-ups to the fleet's broker."""
    with celery_runtime(pg_url, redis_url, scripts) as runtime:
        yield runtime
