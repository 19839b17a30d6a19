"""The Celery side: the app, its configuration, and thin tasks that call the services."""
