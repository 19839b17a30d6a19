"""Kombu's filesystem transport, mended so a consumer never reads a message half written.

The embedded broker (`make demo`, a single machine without Redis) is a folder of message files.
Kombu 5.7.0 creates each message file in the queue folder and then writes it; a consumer that
lists the folder in between moves the file away and reads it empty or half written: a
`JSONDecodeError` that stops a worker with "Unrecoverable error", and a lost wake-up. Its
exchange table (`control/<exchange>.exchange`) has the same gap: a new table file is created
empty, then locked and written, and a reader can take the lock first.

Here every file a reader may see is complete when it appears:
- a message is written to a staging folder beside the queue and renamed into the queue;
- a consumer claims a message by renaming it into the processed folder (one rename wins, the
  other consumers move on), reads it there and deletes it;
- an exchange table is rewritten under a lock file and replaced by a rename.
The folders are siblings under one broker folder, so every rename stays on one filesystem.
"""

from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from queue import Empty
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem as kombu_filesystem
from kombu.utils.json import dumps, loads

__all__ = ["TRANSPORT", "Channel", "Transport"]

#: The value of Celery's `broker_transport` setting that selects this transport.
TRANSPORT = "workers.filesystem_broker:Transport"


def _encode(value: Any) -> bytes:
    text: str = dumps(value)  # type: ignore[no-untyped-call]
    return text.encode("utf-8")


def _decode(data: bytes) -> Any:
    return loads(data.decode("utf-8"))  # type: ignore[no-untyped-call]


def _write_then_rename(folder: Path, target: Path, data: bytes) -> None:
    """Write `data` to a new file in `folder`, then rename it to `target` (atomic)."""
    staged = folder / f".{uuid.uuid4().hex}.tmp"
    try:
        with open(staged, "wb") as handle:
            handle.write(data)
        os.replace(staged, target)
    except OSError as exc:
        staged.unlink(missing_ok=True)
        raise ChannelError(f"Cannot write {target}: {exc.strerror or exc}") from exc


class Channel(kombu_filesystem.Channel):
    """A filesystem channel whose readers only ever see whole files."""

    @property
    def staging_folder(self) -> Path:
        folder = self.transport_options.get("staging_folder")
        return Path(folder) if folder else Path(self.data_folder_out).parent / "staging"

    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Put `payload` onto `queue`: staged, then renamed into the queue folder."""
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        self.staging_folder.mkdir(parents=True, exist_ok=True)
        data = _encode(payload)
        _write_then_rename(self.staging_folder, Path(self.data_folder_out) / name, data)

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        """Claim the oldest message of `queue` by renaming it away, then read it."""
        wanted = f"{queue}.msg"
        inbox = Path(self.data_folder_in)
        claimed_folder = Path(self.processed_folder)
        claimed_folder.mkdir(parents=True, exist_ok=True)
        for name in sorted(os.listdir(inbox)):
            if name.partition(".")[2] != wanted:
                continue
            claimed = claimed_folder / f"{name}.{uuid.uuid4().hex}"
            try:
                os.rename(inbox / name, claimed)
            except FileNotFoundError:
                continue  # another consumer claimed it first
            except OSError as exc:
                raise ChannelError(f"Cannot claim {inbox / name}: {exc.strerror or exc}") from exc
            try:
                payload = claimed.read_bytes()
                if not self.store_processed:
                    claimed.unlink()
            except OSError as exc:
                raise ChannelError(f"Cannot read {claimed}: {exc.strerror or exc}") from exc
            return _decode(payload)
        raise Empty()

    def _table_file(self, exchange: str) -> Path:
        table: Path = self._exchange_file(exchange)  # type: ignore[no-untyped-call]
        return table

    @contextmanager
    def _table_lock(self, exchange: str) -> Iterator[Path]:
        """The exchange table's file, held under an exclusive lock on a lock file beside it."""
        table = self._table_file(exchange)
        table.parent.mkdir(parents=True, exist_ok=True)
        with open(table.parent / f".{table.name}.lock", "ab") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield table
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def get_table(self, exchange: str) -> list[Any]:
        table = self._table_file(exchange)
        try:
            rows = _decode(table.read_bytes())
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ChannelError(f"Cannot open {table}") from exc
        return [kombu_filesystem.exchange_queue_t(*row) for row in rows]

    def _rewrite_table(self, exchange: str, add: Any = None, remove: Any = None) -> None:
        with self._table_lock(exchange) as table:
            rows = self.get_table(exchange)
            if add is not None and add not in rows:
                rows.insert(0, add)
            elif remove is not None and remove in rows:
                rows.remove(remove)
            else:
                return
            _write_then_rename(table.parent, table, _encode(rows))

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        row = kombu_filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        self._rewrite_table(exchange, add=row)

    def _delete(
        self, queue: str, exchange: str, routing_key: str, pattern: str, *args: Any, **kwargs: Any
    ) -> None:
        # The virtual channel's own bookkeeping, skipping the filesystem channel's table edit.
        super(kombu_filesystem.Channel, self)._delete(  # type: ignore[no-untyped-call]
            queue, exchange, routing_key, pattern, *args, **kwargs
        )
        row = kombu_filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        self._rewrite_table(exchange, remove=row)


class Transport(kombu_filesystem.Transport):
    """Kombu's filesystem transport with the channel above."""

    Channel = Channel
    #: The app's `filesystem://` is kept as given (a folder has no host, user or port to parse
    #: out of it), and `as_uri` below names the connection.
    can_parse_url = True

    def as_uri(self, uri: str, include_password: bool = False, mask: str = "**") -> str:
        """The broker's folder, `filesystem:///.../broker`: what Celery's worker banner
        (`.> transport:`) and its `Connected to` line print. Kombu's own rendering read
        `workers.filesystem_broker:Transport://:**@localhost//` (the transport's import path,
        a masked password and a host it never had). No secret is in a folder's name."""
        options = self.client.transport_options if self.client is not None else {}
        queue = options.get("data_folder_in")
        return f"filesystem://{Path(queue).parent}" if queue else uri

    @property
    def default_connection_params(self) -> dict[str, Any]:
        """No default host: a folder has none. Kombu's virtual transports default to
        `localhost`, and every connection it derives from the app's `filesystem://` (the
        producer pool's at each wake-up sent, the worker's consumer, its banner) logged "No
        hostname was supplied. Reverting to default 'localhost'", read as a broker
        misconfigured. The folders are in the transport options; the host was never read."""
        return {"port": self.default_port}
