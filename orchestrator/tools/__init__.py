"""Agent tools, one module per family, all built on `orchestrator.tools.base`."""
