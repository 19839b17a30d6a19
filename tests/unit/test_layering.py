"""Imports go from runtime to domain, never back (STYLE, "Layout that shows the architecture").

Read from the source with `ast`, not by importing: the rule is about what a module names, and a
module imported for the test would pull in everything it names anyway.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"

#: What the domain may not name: I/O libraries and the layers that do I/O.
DOMAIN_FORBIDDEN = (
    "sqlalchemy",
    "httpx",
    "redis",
    "celery",
    "orchestrator.store",
    "orchestrator.leases",
    "orchestrator.agent",
    "orchestrator.tools",
    "orchestrator.services",
    "orchestrator.api",
)
#: What the store may not name: the layers that use it (the SQL lease back end is one).
STORE_FORBIDDEN = (
    "orchestrator.leases",
    "orchestrator.agent",
    "orchestrator.tools",
    "orchestrator.services",
    "orchestrator.api",
)


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (TYPE_CHECKING blocks and functions too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
    return names


def _offences(package: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted((PACKAGE / package).glob("*.py")):
        for name in sorted(_imports(path)):
            if any(name == bad or name.startswith(bad + ".") for bad in forbidden):
                found.append(f"{path.relative_to(PACKAGE.parent)} imports {name}")
    return found


@pytest.mark.parametrize(
    ("package", "forbidden"), [("domain", DOMAIN_FORBIDDEN), ("store", STORE_FORBIDDEN)]
)
def test_a_layer_imports_nothing_from_the_layers_above_it(
    package: str, forbidden: tuple[str, ...]
) -> None:
    assert list((PACKAGE / package).glob("*.py")), f"no modules found under {package}"
    assert _offences(package, forbidden) == []
