"""Which configured secrets are looked for in what the model writes and in a command's
environment (`orchestrator.logs.distinctive`): a store password that is a word (`postgres`)
turned that word into `***` in reports and commands, and dropped a PATH through
`/usr/lib/postgresql` from every command's environment."""

from __future__ import annotations

from orchestrator.agent.sensitive import hide_configured
from orchestrator.logs import distinctive
from orchestrator.tools.child_processes import child_environment

KEY = "sk-live-0123456789abcdef"


def test_a_word_or_a_short_value_is_not_distinctive() -> None:
    assert not distinctive("postgres")
    assert not distinctive("orchestrator")
    assert not distinctive("s3cret")  # under 8 characters
    assert distinctive(KEY)
    assert distinctive("orch-pass-2026")


def test_what_the_model_writes_keeps_a_word_that_is_also_the_store_password() -> None:
    written = {"summary": f"postgres answered; key {KEY}", "nodes": [{"title": "restart postgres"}]}
    assert hide_configured(written, ["postgres", KEY]) == {
        "summary": "postgres answered; key ***",
        "nodes": [{"title": "restart postgres"}],
    }


def test_a_command_keeps_its_path_but_not_a_variable_holding_a_secret() -> None:
    parent = {
        "PATH": "/usr/lib/postgresql/15/bin:/usr/bin",
        "HOME": "/root",
        "PGPASSWORD": "postgres",
        "DATABASE_URL": "postgresql://orch:postgres@db:5432/orchestrator",
        "TOKEN_FILE_CONTENT": f"bearer {KEY}",
        "ORCH_SOMETHING": "x",
        "LLM_API_KEY": KEY,
    }
    kept = child_environment(parent, ["postgres", "root", KEY], {"MODE": "check"})
    assert kept == {"PATH": parent["PATH"], "HOME": "/root", "MODE": "check"}
