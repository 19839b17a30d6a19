"""The processes a test starts run the code of the checkout under test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_a_started_process_imports_this_checkout(tmp_path: Path) -> None:
    # From another folder, as the fleet tests start workers: only the environment can say
    # where the code is.
    found = subprocess.run(
        [sys.executable, "-c", "import orchestrator; print(orchestrator.__file__)"],
        cwd=tmp_path,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(found).resolve().is_relative_to(ROOT)
