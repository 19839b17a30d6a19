"""Operator accounts (ORCH_OPERATORS): who calls the API, and what their role lets them do.

The file holds one account a line, `NAME ROLE TOKEN-SHA256-HEX` (whitespace between, `#`
comments). Only the SHA-256 of a token is stored. A presented token is hashed and compared with
every account's hash in constant time (no early exit), and is never logged. The single
ORCH_API_TOKEN stays one full-rights account, named `api`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from orchestrator.domain.storable import NAME_MAX

__all__ = [
    "API_TOKEN_ACCOUNT",
    "ROLES",
    "Account",
    "Operator",
    "OperatorsError",
    "api_account",
    "find_account",
    "find_operator",
    "load_operators",
    "may",
]

#: Roles, each allowed what the one before is, and more.
ROLES: Final = ("viewer", "operator", "approver")
API_TOKEN_ACCOUNT: Final = "api"
#: An account's name is the `by` of what it does: no longer than any `by` (NAME_MAX).
_NAME: Final = re.compile(rf"[A-Za-z0-9_.@-]{{1,{NAME_MAX}}}")
_HEX: Final = re.compile(r"[0-9a-f]{64}")


class OperatorsError(ValueError):
    """The operators file cannot be used; the message names the line, never a hash.

    `public` is what a caller who may hold no token is told (`503 operators_unreadable`): the
    line and the kind of problem, never an account name (which the message, for the operator's
    log and start-up, may give).
    """

    def __init__(self, message: str, *, public: str | None = None) -> None:
        super().__init__(message)
        self.public = message if public is None else public


@dataclass(frozen=True)
class Operator:
    name: str
    role: str
    shared: bool = False  # the ORCH_API_TOKEN account: `by` of a decision comes from the body


def may(operator: Operator, needs: str) -> bool:
    """Whether `operator`'s role is at least `needs`."""
    return ROLES.index(operator.role) >= ROLES.index(needs)


@dataclass(frozen=True)
class Account:
    """An account as the server knows it: who, and the SHA-256 of its token (never the token)."""

    operator: Operator
    digest: bytes


def _sha256(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def api_account(api_token: str | None) -> Account | None:
    """The ORCH_API_TOKEN account (full rights, shared), or None when no token is set."""
    if not api_token:
        return None
    return Account(Operator(API_TOKEN_ACCOUNT, "approver", shared=True), _sha256(api_token))


#: sha256 of the empty string.
_EMPTY_TOKEN_HASH = hashlib.sha256(b"").hexdigest()


def load_operators(path: Path) -> tuple[Account, ...]:
    """The accounts in `path`; `OperatorsError` for an unreadable file or a bad line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise OperatorsError(f"cannot read the operators file {path}: {exc}") from None
    accounts: list[Account] = []
    names: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 3:
            raise OperatorsError(f"{path} line {number}: expected NAME ROLE TOKEN-SHA256-HEX")
        name, role, digest = parts[0], parts[1], parts[2].lower().removeprefix("sha256:")
        if not _NAME.fullmatch(name) or name == API_TOKEN_ACCOUNT:
            raise OperatorsError(f"{path} line {number}: invalid or reserved name")
        if role not in ROLES:
            raise OperatorsError(f"{path} line {number}: role must be one of {', '.join(ROLES)}")
        if not _HEX.fullmatch(digest):
            raise OperatorsError(f"{path} line {number}: the token hash is not 64 hex digits")
        if digest == _EMPTY_TOKEN_HASH:
            # What `printf %s "$TOKEN" | sha256sum` prints with $TOKEN unset: an account no
            # one could sign in to (an empty token names no one), and surely not what was meant.
            raise OperatorsError(
                f"{path} line {number}: the token hash is the empty token's (sha256 of nothing: "
                "was the token variable unset when it was hashed?)"
            )
        if name in names:
            raise OperatorsError(
                f"{path} line {number}: account {name} appears twice",
                public=f"{path} line {number}: an account name appears twice",
            )
        names.add(name)
        accounts.append(Account(Operator(name, role), bytes.fromhex(digest)))
    if not accounts:
        # With no account (and no ORCH_API_TOKEN) the API is the open loopback one, every
        # caller an approver; `orchestrator api` lets a set ORCH_OPERATORS listen on the network.
        raise OperatorsError(f"{path} names no account; list at least one, or unset it")
    return tuple(accounts)


def find_account(presented: bytes, accounts: Sequence[Account]) -> Account | None:
    """The account whose token is `presented`, or None; every hash is compared, in constant
    time each, whatever matched first. An empty token names no one."""
    if not presented:
        return None
    digest = hashlib.sha256(presented).digest()
    found: Account | None = None
    for account in accounts:
        if hmac.compare_digest(digest, account.digest) and found is None:
            found = account
    return found


def find_operator(
    presented: bytes, accounts: Sequence[Account], api_token: str | None
) -> Operator | None:
    """The operator whose token is `presented` (ORCH_API_TOKEN's account first), or None."""
    shared = api_account(api_token)
    found = find_account(presented, ((shared,) if shared else ()) + tuple(accounts))
    return found.operator if found else None
