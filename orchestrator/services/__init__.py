"""Services: each public call owns one transaction and combines domain rules with the store."""

from __future__ import annotations

__all__: list[str] = []
