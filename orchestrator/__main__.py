from __future__ import annotations

import sys

from orchestrator.cli import main

sys.exit(main())
