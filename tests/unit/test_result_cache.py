"""The in-memory large-result cache: limits, expiry, isolation, clearance."""

from __future__ import annotations

import pytest

from orchestrator.tools.base import ToolContext
from orchestrator.tools.results import ResultCache

CTX = ToolContext(owner="alice", session_id="s1", round_id="r1")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_expires_after_fifteen_minutes() -> None:
    clock = Clock()
    cache = ResultCache(clock=clock)
    stored = cache.put(CTX, "x" * 10)
    assert stored.result_id is not None
    clock.now += 15 * 60 - 1
    assert cache.read(CTX, stored.result_id, 0, 5)["content"] == "xxxxx"
    clock.now += 2
    with pytest.raises(LookupError, match="invalid"):
        cache.read(CTX, stored.result_id, 0, 5)


def test_at_most_eight_results_a_graph_oldest_evicted() -> None:
    cache = ResultCache()
    ids = [cache.put(CTX, f"r{i}").result_id for i in range(9)]
    assert cache.count("s1") == 8
    with pytest.raises(LookupError):
        cache.read(CTX, ids[0] or "", 0, 1)
    assert cache.read(CTX, ids[8] or "", 0, 2)["content"] == "r8"
    # Another graph has its own budget.
    assert cache.put(ToolContext("alice", "s2", "r1"), "y").result_id is not None
    assert cache.count("s1") == 8


def test_one_mib_a_result_and_four_a_graph() -> None:
    cache = ResultCache()
    refused = cache.put(CTX, "é" * (512 * 1024 + 1))  # 1 MiB + 2 bytes in UTF-8
    assert refused.result_id is None
    assert "narrow" in (refused.reason or "")
    megabyte = "a" * (1024 * 1024)
    ids = [cache.put(CTX, megabyte).result_id for _ in range(5)]
    assert cache.count("s1") == 4  # the fifth pushed the first out
    with pytest.raises(LookupError):
        cache.read(CTX, ids[0] or "", 0, 1)


def test_rebuild_and_clearance_invalidate() -> None:
    cache = ResultCache()
    admin = ToolContext("alice", "s1", "r1", extras={"clearance": 2})
    stored = cache.put(admin, "admin data")
    assert stored.result_id is not None
    assert cache.read(admin, stored.result_id, 0, 5)["content"] == "admin"
    with pytest.raises(LookupError):
        cache.read(CTX, stored.result_id, 0, 5)  # privileges dropped
    cache.drop_graph("s1")
    with pytest.raises(LookupError):
        cache.read(admin, stored.result_id, 0, 5)


def test_offsets_past_the_end_are_refused() -> None:
    cache = ResultCache()
    stored = cache.put(CTX, "abc")
    assert stored.result_id is not None
    assert cache.read(CTX, stored.result_id, 3, 5)["content"] == ""
    with pytest.raises(IndexError):
        cache.read(CTX, stored.result_id, 4, 5)
