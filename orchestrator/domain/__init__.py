"""Pure rules of the orchestrator: no I/O, no SQL, no HTTP, no Celery."""
