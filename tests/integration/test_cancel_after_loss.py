"""A task cancelled after a worker loss is final: no "lost in a row" count is left on it, as
none is on a task that ends any other way; its generations still show the loss."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from orchestrator.cli.task_show import render_explain
from orchestrator.leases.keys import task_lease
from orchestrator.services.tasks import Trigger
from orchestrator.store.types import utcnow
from tests.executions_support import claim_as_worker, runtime_for


def test_a_cancel_after_a_worker_loss_leaves_no_losses_in_a_row(
    store_url: str, tmp_path: Path
) -> None:
    rt, _ = runtime_for(store_url, tmp_path / "scripts", max_recoveries=3)
    try:
        task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
        token = claim_as_worker(rt, task_id, 1, "doomed-worker", 30)
        # Its worker dies: the lease is gone, and the sweep's clock is past the mirrored one.
        rt.leases.release(task_lease(task_id), token)
        assert rt.sweeper.sweep(utcnow() + timedelta(seconds=31)).requeued == [(task_id, 1, 2)]
        assert rt.tasks.get(task_id).recoveries == 1

        cancelled = rt.tasks.cancel(task_id, "not needed any more")

        assert (cancelled.status, cancelled.recoveries, cancelled.handbacks) == ("cancelled", 0, 0)
        view = rt.tasks.explain(task_id)
        assert (view["recoveries"], view["handbacks"]) == (0, 0)
        shown = render_explain(view)
        assert "lost in a row" not in shown, shown
        assert [ex["outcome"] for ex in view["executions"]] == ["lost", "cancelled"]
    finally:
        rt.close()
