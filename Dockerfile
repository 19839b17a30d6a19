# One image for every role of the fleet: `orchestrator api|worker|sweeper|db upgrade`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ORCH_HOME=/var/lib/orchestrator

WORKDIR /app

# Dependencies first, from pyproject.toml alone, so a code change does not reinstall them.
COPY pyproject.toml README.md ./
RUN mkdir -p orchestrator workers \
    && touch orchestrator/__init__.py workers/__init__.py \
    && pip install -e . \
    && rm -rf orchestrator workers

# Editable on purpose: `orchestrator db upgrade` finds alembic.ini and alembic/ beside the
# package source, which a plain site-packages install would leave behind.
COPY . .
# The bytecode is written here, once: with PYTHONDONTWRITEBYTECODE every process of the fleet
# would otherwise compile the package's source as it starts (about 0.3 s of CPU each).
RUN pip install --no-deps -e . \
    && python -m compileall -q orchestrator workers alembic \
    && useradd --system --home-dir "$ORCH_HOME" --create-home orchestrator

USER orchestrator

ENTRYPOINT ["orchestrator"]
CMD ["--help"]
