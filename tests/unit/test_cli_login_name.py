"""The CLI's `--by` default (tasks requeue and cancel): the user running it, or a usage error.

`orchestrator tasks requeue` and `cancel` record who asked; without `--by` they took
`getpass.getuser()`, which raises a KeyError (OSError since Python 3.13) for a user id the
password database does not list when LOGNAME and USER are unset: a container run under an
arbitrary id. The command then ended in a traceback, where before it recorded no name and ran.
"""

from __future__ import annotations

import os
import pwd

import pytest

from orchestrator.cli.common import CommandFailed, login_name


def _unlisted_uid() -> int:
    listed = {entry.pw_uid for entry in pwd.getpwall()}
    return next(uid for uid in range(54321, 64000) if uid not in listed)


def test_the_environment_names_the_user_first() -> None:
    assert login_name({"USER": "otto"}, uid=_unlisted_uid()) == "otto"
    assert login_name({"LOGNAME": "ada", "USER": "otto"}) == "ada"


def test_the_password_database_names_a_listed_user() -> None:
    assert login_name({}, uid=os.getuid()) == pwd.getpwuid(os.getuid()).pw_name


def test_an_unlisted_user_without_a_name_is_told_to_give_by() -> None:
    uid = _unlisted_uid()
    with pytest.raises(CommandFailed, match=f"give --by: .*user id {uid}") as raised:
        login_name({}, uid=uid)
    assert raised.value.exit_code == 2


def test_a_command_without_by_says_to_set_user() -> None:
    """`tasks ask` names the asker with no option to give: the line says what to set."""
    uid = _unlisted_uid()
    with pytest.raises(CommandFailed, match=f"^set USER: .*user id {uid}"):
        login_name({}, uid=uid, option=None)
