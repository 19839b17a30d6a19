"""How many records a page of evidence holds: the default and the bound that the API's query, the
CLI's `--limit` and the service share. Here, with no import, as the CLI builds its parser (and
answers `--help`) before any store or service is loaded."""

from __future__ import annotations

from typing import Final

__all__ = ["EVIDENCE_PAGE", "EVIDENCE_PAGE_MAX"]

EVIDENCE_PAGE: Final = 100  # records in a page unless asked otherwise
EVIDENCE_PAGE_MAX: Final = 200  # the most in one page, and the most ids asked for at once
