"""What every command group shares: the handler type, JSON output, the store from settings."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn

from orchestrator.domain.times import wire_time

if TYPE_CHECKING:
    from orchestrator.runtime import Runtime
    from orchestrator.settings import Settings

__all__ = [
    "CommandFailed",
    "Handler",
    "OneLineParser",
    "add_json_flag",
    "bounded_int",
    "checked_body",
    "command_runtime",
    "load",
    "login_name",
    "one_line",
    "print_json",
    "printable",
    "safe_store_url",
    "time_text",
]

Handler = Callable[[argparse.Namespace], int]

_loaded: Settings | None = None


class CommandFailed(Exception):
    """A command cannot do what was asked; the message is printed as one line."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line and exit code 2 (the usage is under --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse `type`: a whole number from `low` to `high`, else a one-line usage error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, not {value}")
        return value

    return parse


def cursor_arg(text: str) -> str:
    """An argparse `type`: a page cursor as a listing printed it (`next_cursor`)."""
    from orchestrator.domain.cursors import decode_cursor
    from orchestrator.errors import ValidationFailed

    try:
        decode_cursor(text)
    except ValidationFailed as exc:
        try:  # an oldest-first list's (the command checks the order it is asked with)
            decode_cursor(text, oldest_first=True)
        except ValidationFailed:
            raise argparse.ArgumentTypeError(exc.message) from None
    return text


def checked_body(model: Any, values: Mapping[str, Any]) -> Any:
    """`values` as the API's request `model` takes them, or a one-line usage error naming the
    option (`invalid --by: ...`): the same limits on the CLI's path as on the API's."""
    from pydantic import ValidationError

    try:
        return model.model_validate(dict(values))
    except ValidationError as exc:
        first = exc.errors()[0]
        option = ".".join(str(part) for part in first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        raise CommandFailed(f"invalid --{option}: {message}", exit_code=2) from None


def load() -> Settings:
    """Settings for a command; a bad value raises `SettingsError` (exit code 2)."""
    from orchestrator.settings import load_settings

    global _loaded
    _loaded = load_settings()
    return _loaded


def command_runtime() -> Runtime:
    """The runtime of a command that reads or changes the store, on the settings `load` reads.
    Its dispatcher is the production one, made at the first wake-up the command sends
    (`FirstUseDispatcher`): a read, a cancel or a decision that queues nothing never imports
    Celery, and no command can drop a wake-up it came to send."""
    from orchestrator.runtime import build_runtime, celery_dispatcher
    from orchestrator.services.dispatch import FirstUseDispatcher

    settings = load()
    return build_runtime(
        settings, dispatcher=FirstUseDispatcher(lambda: celery_dispatcher(settings))
    )


#: C0 and C1 controls, line separators, and the characters that reorder or hide text on a
#: terminal that renders bidirectional text: bidi controls and zero-width characters (the
#: console shows the same set as markers).
_CONTROL = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064"
    r"\u2066-\u2069\ufeff]"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def login_name(
    environ: Mapping[str, str] | None = None,
    uid: int | None = None,
    *,
    option: str | None = "--by",
) -> str:
    """Who runs the command, for a `--by` left out, as `getpass.getuser()` reads it: $LOGNAME,
    $USER, $LNAME, $USERNAME, else the password database's entry of the user id. A container
    run under an id the image does not list (an arbitrary id, as OpenShift gives) with none of
    those set has no name: a usage error saying to give `option` (or to set USER, for a
    command with no such option), not getpass's traceback. `environ` and `uid` are this
    process's unless given."""
    import pwd

    environ = os.environ if environ is None else environ
    for key in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        if environ.get(key):
            return environ[key]
    uid = os.getuid() if uid is None else uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        raise CommandFailed(
            f"{f'give {option}' if option else 'set USER'}: your user name cannot be read "
            f"(user id {uid} is not in the password database, and LOGNAME and USER are unset)",
            exit_code=2,
        ) from None


def printable(text: Any) -> str:
    """`text` on one line, its control characters escaped: a value from the store (a title, a
    reason) can neither forge a line of the output, nor drive the operator's terminal, nor
    reorder or hide what the operator reads (`abc\u202edcba` prints as written)."""
    return _CONTROL.sub(_escaped, str(text))


def time_text(value: Any) -> str:
    """A time as the CLI's pages print it: ISO 8601, to the second, which `--since` and other
    tools read (Python's own form, `2026-12-05 23:40:49.105250+00:00`, they do not)."""
    return value.isoformat(timespec="seconds") if hasattr(value, "isoformat") else str(value)


def safe_store_url() -> str | None:
    """The store URL of the settings last loaded, with its password masked; None before any."""
    if _loaded is None:
        return None
    return mask_url(_loaded.store_url)


def mask_url(url: str) -> str:
    """`url` with its password masked, also one given in the query (`?password=`, libpq's
    `sslpassword`), which `hide_password` leaves as it is."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return "(unparsable URL)"
    keys = _secret_query_keys(parsed.query)
    if keys:
        parsed = parsed.update_query_dict(dict.fromkeys(keys, _MASKED))
    return parsed.render_as_string(hide_password=True).replace(_MASKED, "***")


#: Stands in for a query's secret while the URL is rendered (which would quote `***`).
_MASKED = "ORCH-MASKED-SECRET"


def _secret_query_keys(query: Mapping[str, Any]) -> list[str]:
    return [key for key in query if "password" in key.lower()]


def one_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an error's text, without the store's password, at most `limit` chars.

    For a SQLAlchemy error the driver's own message is used (not the statement and parameters).
    """
    cause = getattr(exc, "orig", None) or exc
    text = str(cause).strip().splitlines()
    line = text[0].strip() if text else type(cause).__name__
    for password in _passwords():
        line = line.replace(password, "***")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _passwords() -> list[str]:
    """The store URL's secrets: its password, and any given in its query."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if _loaded is None:
        return []
    try:
        parsed = make_url(_loaded.store_url)
    except ArgumentError:
        return []
    found = [parsed.password] if parsed.password else []
    for key in _secret_query_keys(parsed.query):
        value = parsed.query[key]
        found += [value] if isinstance(value, str) else list(value)
    return [secret for secret in found if secret]


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return wire_time(value)
    raise TypeError(f"cannot encode {type(value).__name__}")


def print_json(payload: Any) -> None:
    json.dump(payload, sys.stdout, indent=2, sort_keys=True, default=_default, ensure_ascii=False)
    sys.stdout.write("\n")


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
