"""CPU per execution in process: this checkout against another one, the two alternating.

    python bench/inprocess_ab.py --baseline /path/to/other/checkout [--executions 150] [--pairs 3]
        [--secret] [--callgrind]

Each side runs in a child process of its own, with its checkout first on `sys.path` and its own
Postgres and Redis (`execution_fleet.servers`): scripted minimal and report-only executions
through `rt.executions.run`, the CPU of every thread of the process (`time.process_time`) around
each, the median after a warm-up of 10. The sides alternate, so the machine's drift shows in
every pair and the ratio within a pair is the figure to read. `--secret` configures an API key
on both sides, as a deployment has one (`LLM_API_KEY`): what the host masks in every write's
arguments and every tool's result is then looked for, as in production. It prints and writes
nothing else: `bench/executions.py` is the benchmark of record; this is how a change's effect on the
worker's own Python is checked before and after (a worktree of the older commit as baseline).

On a shared machine the CPU medians move 10 to 20 % from one pair to the next. `--callgrind`
counts instructions instead: each side runs under valgrind's callgrind (Debian's `valgrind`),
one kind at a time, with collection switched on only around its timed executions (after the
warm-up, `callgrind_control -i on` from inside the process), every thread of the process; it
prints millions of instructions per execution. Counts stay within about 1.5 % from run to run,
whatever else the machine does, so a change of 3 % shows. About 30 s per side and kind for
30 executions (`--executions 30` is enough). The kernel's work for the process (system calls,
threads started) is not counted.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from execution_fleet import MINIMAL, REPORT_ONLY

HERE = Path(__file__).resolve().parents[1]

# Run in the child, with the checkout under test as argv[1]: prints one JSON line of medians.
_CHILD = r"""
import inspect, json, statistics, sys, tempfile, shutil, time
from contextlib import ExitStack
from pathlib import Path
checkout, count, secret = sys.argv[1], int(sys.argv[2]), sys.argv[3]
only = sys.argv[4] if len(sys.argv) > 4 else ""  # one kind, counted under callgrind
def collect(on):
    if only:  # callgrind_control talks to the valgrind this process runs under
        import os, subprocess
        switch = ["callgrind_control", "-i", "on" if on else "off", str(os.getpid())]
        subprocess.run(switch, check=True, capture_output=True)
sys.path[:0] = [checkout, checkout + "/bench"]
from execution_fleet import servers, MINIMAL, REPORT_ONLY, minimal_turns, report_only_turns
from execution_fleet import LEASE, RENEW, SWEEP
from tests.executions_support import write_script, settings_for
from orchestrator.runtime import build_runtime
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.tasks import Trigger
folder = Path(tempfile.mkdtemp(prefix="ab-"))
medians = {}
try:
    with ExitStack() as stack:
        _, pg_url, redis_url, _ = stack.enter_context(servers(False))
        write_script(folder / "scripts", MINIMAL, minimal_turns())
        write_script(folder / "scripts", REPORT_ONLY, report_only_turns())
        settings = settings_for(
            pg_url, folder / "scripts", redis_url=redis_url, lease_seconds=LEASE,
            lease_renew_seconds=RENEW, sweep_seconds=SWEEP, queued_stale_seconds=60,
            home=folder / "home", **({"llm_api_key": secret} if secret else {}),
        )
        rt = build_runtime(settings, dispatcher=RecordingDispatcher())
        # A worker's common wake-up, on a checkout that tells it apart (a first delivery).
        first = {"first_delivery": True}
        if "first_delivery" not in inspect.signature(rt.executions.run).parameters:
            first = {}
        try:
            for kind in [only] if only else (MINIMAL, REPORT_ONLY):
                used = []
                tasks = [
                    rt.tasks.trigger(Trigger(task_type=kind, title="ab")).task.task_id
                    for _ in range(count + 10)
                ]
                for number, task in enumerate(tasks):
                    if number == 10:
                        collect(True)
                    started = time.process_time()
                    rt.executions.run(task, 1, worker="ab", **first)
                    if number >= 10:
                        used.append((time.process_time() - started) * 1000)
                collect(False)
                medians[kind] = statistics.median(used)
        finally:
            rt.close()
finally:
    shutil.rmtree(folder, ignore_errors=True)
print(json.dumps(medians))
"""


#: The key `--secret` configures: distinctive (`orchestrator.logs.distinctive`), so looked for.
SECRET = "sk-bench-5c1e7a0d9b3f"


def _side(checkout: Path, count: int, secret: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(checkout), str(count), secret],
        capture_output=True,
        text=True,
        cwd=checkout,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the run on {checkout} failed:\n{done.stderr[-2000:]}")
    medians: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return medians


def _counted(checkout: Path, count: int, secret: str) -> dict[str, float]:
    """Millions of instructions per execution of each kind, counted by callgrind."""
    counts: dict[str, float] = {}
    for kind in (MINIMAL, REPORT_ONLY):
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                "--callgrind-out-file=/dev/null",
                sys.executable,
                "-c",
                _CHILD,
                str(checkout),
                str(count),
                secret,
                kind,
            ],
            capture_output=True,
            text=True,
            cwd=checkout,
            timeout=1800,
            check=False,
        )
        found = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode != 0 or found is None:
            raise SystemExit(f"the counted run on {checkout} failed:\n{done.stderr[-2000:]}")
        counts[kind] = int(found.group(1)) / count / 1e6
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="the other checkout")
    parser.add_argument("--executions", type=int, default=150, help="timed runs per kind")
    parser.add_argument("--pairs", type=int, default=3, help="baseline/this alternations")
    parser.add_argument(
        "--secret", action="store_true", help="configure an API key on both sides (LLM_API_KEY)"
    )
    parser.add_argument(
        "--callgrind", action="store_true", help="count instructions (valgrind) instead of CPU"
    )
    args = parser.parse_args()
    baseline = args.baseline.resolve()
    if not (baseline / "orchestrator").is_dir():
        raise SystemExit(f"--baseline {baseline}: not a checkout of this project")
    if args.callgrind and shutil.which("valgrind") is None:
        raise SystemExit("--callgrind needs valgrind (Debian: apt-get install valgrind)")
    side = _counted if args.callgrind else _side
    unit = "M instr" if args.callgrind else "ms"
    print(f"pair  kind          {'baseline ' + unit:>16}  {'this ' + unit:>12}  this/baseline")
    for pair in range(1, args.pairs + 1):
        secret = SECRET if args.secret else ""
        before = side(baseline, args.executions, secret)
        after = side(HERE, args.executions, secret)
        for kind in before:
            ratio = after[kind] / before[kind]
            figures = f"{before[kind]:>16.2f}  {after[kind]:>12.2f}  {ratio:>13.3f}"
            print(f"{pair:>4}  {kind:<12}  {figures}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
