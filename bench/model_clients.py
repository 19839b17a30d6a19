"""What one `openai.OpenAI` client per execution would cost beside the shared one, in one run.

N threads (the rounds of a threads-pool worker) each make a few chat-completions calls against
the loopback OpenAI-compatible server of the tests, answering after `--delay` seconds: once all
through one shared client (what `orchestrator.agent.openai_model.client_for` gives a process),
once each through its own client (its own httpx pool). Each mode runs in a fresh process;
the server runs in another, so the figures are the client side's alone.

    .venv/bin/python bench/model_clients.py --threads 200 --write
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from docs_section import DOC, write_section
from execution_fleet import ROOT

CALLS = 3


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def measure(mode: str, threads: int, base_url: str) -> dict[str, Any]:
    """In this process: RSS and open files before, at peak, and after the calls."""
    import openai

    def client() -> openai.OpenAI:
        return openai.OpenAI(base_url=base_url, api_key="not-needed", max_retries=0)

    shared = client()
    ask: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    shared.chat.completions.create(**ask)  # imports and the first connection, before measuring
    base_rss, base_fds = _rss_mib(), _fds()
    peak_rss, peak_fds = base_rss, base_fds

    def run() -> None:
        own = shared if mode == "shared" else client()
        for _ in range(CALLS):
            own.chat.completions.create(**ask)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    while any(w.is_alive() for w in workers):
        peak_rss, peak_fds = max(peak_rss, _rss_mib()), max(peak_fds, _fds())
        time.sleep(0.05)
    return {
        "mode": mode,
        "added_kib": (peak_rss - base_rss) * 1024 / threads,
        "peak_fds": peak_fds - base_fds,
        "after_fds": _fds() - base_fds,
    }


def serve(delay: float) -> None:
    """The loopback server, in its own process: prints its URL, serves until stdin closes."""
    from tests.openai_server import OpenAIServer

    with OpenAIServer(delay_s=delay) as server:
        print(server.base_url, flush=True)
        sys.stdin.read()


def report(rows: list[dict[str, Any]], command: str, threads: int, delay: float) -> str:
    by = {r["mode"]: r for r in rows}
    ratio = by["per-execution"]["added_kib"] / max(by["shared"]["added_kib"], 1e-9)
    lines = [
        "## Model client per process or per execution",
        "",
        f"Command: `{command}`",
        "",
        f"{threads} threads each make {CALLS} chat-completions calls against the loopback "
        f"OpenAI-compatible server (answers after {delay:g} s, in another process): through one "
        "shared `openai.OpenAI` (what `client_for` gives a process), or each through its own "
        "client and httpx pool. Each mode in a fresh process.",
        "",
        "| client | added RSS per thread at peak, KiB | open files added at peak "
        "| open files added after the calls |",
        "| --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['added_kib']:.0f} | {r['peak_fds']} | {r['after_fds']} |")
    lines += [
        "",
        f"A client per execution costs {ratio:.1f}x the memory per execution of the shared one, "
        "and its idle keep-alive connections stay open until the client is collected; the "
        "orchestrator shares one per process and server (`client_for`).",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=200)
    parser.add_argument("--delay", type=float, default=1.0, help="seconds per answer")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--url", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.delay)
        return 0
    if args.measure:
        print(json.dumps(measure(args.measure, args.threads, args.url)))
        return 0
    command = (
        f".venv/bin/python bench/model_clients.py --threads {args.threads} --delay "
        f"{args.delay:g}{' --write' if args.write else ''}"
    )
    me = [sys.executable, str(ROOT / "bench" / "model_clients.py")]
    server = subprocess.Popen(
        [*me, "--serve", "--delay", str(args.delay)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        rows = []
        for mode in ("shared", "per-execution"):
            done = subprocess.run(
                [*me, "--measure", mode, "--threads", str(args.threads), "--url", url],
                capture_output=True,
                text=True,
                check=True,
                timeout=300,
            )
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    finally:
        server.communicate("", timeout=30)
    section = report(rows, command, args.threads, args.delay)
    print(section)
    if args.write:
        write_section("model-clients", section)
        print(f"wrote the section to {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
