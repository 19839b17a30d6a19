"""A task's decided actions from the CLI: `orchestrator actions list --decided --task ID`.

The API lists them page after page (`decided=true`), but the CLI had only `--status S` (one
status at a time) and `--all` (the pending ones among them): an operator asking who approved or
rejected what on a task read three lists, or all of them. `--decided` is every status but
`pending_approval`, newest first, paged as the other lists are, and refused beside `--status`
or `--all` as the API refuses `decided` with `status` or `any`.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from orchestrator.runtime import Runtime
from tests.cli_in_process import run_main
from tests.executions_support import runtime_for
from tests.integration.test_decided_actions import with_actions


@pytest.fixture
def rt(store_url: str, scripts: Path) -> Runtime:
    runtime, _ = runtime_for(store_url, scripts)
    return runtime


def test_actions_list_decided_pages_a_task_s_decisions_newest_first(
    rt: Runtime, store_url: str, scripts: Path, tmp_path: Path
) -> None:
    try:
        task_id, decided = with_actions(rt, scripts)
    finally:
        rt.close()
    env = {"ORCH_HOME": str(tmp_path / "home"), "ORCH_DATABASE_URL": store_url}
    argv = ["actions", "list", "--decided", "--task", task_id, "--limit", "2"]
    seen: list[str] = []
    statuses: set[str] = set()
    pages = 0
    while argv:
        done = run_main(*argv, env=env)
        assert (done.returncode, done.stderr) == (0, ""), done.stderr
        lines = done.stdout.splitlines()
        pages += 1
        listed = [line for line in lines if not line.startswith("next page:")]
        seen += [line.split()[0] for line in listed]
        statuses |= {line.split()[1] for line in listed}
        more = [line.removeprefix("next page: ") for line in lines if line.startswith("next page")]
        argv = shlex.split(more[0])[1:] if more else []
        assert pages < 10, "the cursor does not move on"
        if argv:  # the next page's command asks for the same list
            assert "--decided" in argv
            assert "--status" not in argv
    assert (pages, seen) == (3, decided)  # each once, newest first, none pending
    assert statuses == {"approved", "rejected", "superseded"}
    # In JSON: stdout one array, as the API's items, the way on beside it on stderr.
    done = run_main(
        "actions", "list", "--decided", "--task", task_id, "--limit", "4", "--json", env=env
    )
    assert done.returncode == 0, done.stderr
    items = json.loads(done.stdout)
    assert [a["action_id"] for a in items] == decided[:4]
    assert all("delivery" in a for a in items)
    assert done.stderr.startswith("next page: orchestrator actions list --decided --task ")
    rest = run_main(*shlex.split(done.stderr.removeprefix("next page: "))[1:], env=env)
    assert rest.returncode == 0, rest.stderr
    assert [a["action_id"] for a in json.loads(rest.stdout)] == decided[4:]


@pytest.mark.parametrize("also", [["--all"], ["--status", "approved"]], ids=" ".join)
def test_decided_beside_another_status_option_is_one_line_and_exit_2(
    also: list[str], tmp_path: Path
) -> None:
    done = run_main(
        "actions", "list", "--decided", *also, env={"ORCH_HOME": str(tmp_path / "home")}
    )
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert "--decided" in line
    assert also[0] in line
    assert "not allowed with" in line
