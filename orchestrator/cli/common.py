"""What every command group shares: the handler type, JSON output, the store from settings."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

from orchestrator.settings import Settings, load_settings

__all__ = ["CommandFailed", "Handler", "add_json_flag", "load", "print_json"]

Handler = Callable[[argparse.Namespace], int]


class CommandFailed(Exception):
    """A command cannot do what was asked; the message is printed as one line."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def load() -> Settings:
    """Settings for a command; a bad value raises `SettingsError` (exit code 2)."""
    return load_settings()


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot encode {type(value).__name__}")


def print_json(payload: Any) -> None:
    json.dump(payload, sys.stdout, indent=2, sort_keys=True, default=_default, ensure_ascii=False)
    sys.stdout.write("\n")


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
