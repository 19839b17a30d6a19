"""The process's shared model clients: one per server and key, kept until closed.

An evicted client that still held pooled sockets left them to the garbage collector, whose
`ResourceWarning` (an error under this suite's filterwarnings) then failed whichever test
happened to be running.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from orchestrator.agent.openai_model import client_for, close_clients


def test_one_client_per_server_and_key_however_many_servers_a_process_sees() -> None:
    first = client_for("http://127.0.0.1:9/v1", "k", 5.0)
    for port in range(10, 30):  # more servers than the old cache of 8 kept
        client_for(f"http://127.0.0.1:{port}/v1", "k", 5.0)
    assert client_for("http://127.0.0.1:9/v1", "k", 5.0) is first
    assert client_for("http://127.0.0.1:9/v1", "other", 5.0) is not first


def test_close_clients_closes_each_one_and_the_next_call_makes_a_new_one() -> None:
    client = client_for("http://127.0.0.1:9/v1", "k", 5.0)
    close_clients()
    assert client.is_closed()
    fresh = client_for("http://127.0.0.1:9/v1", "k", 5.0)
    assert fresh is not client
    assert not fresh.is_closed()


def test_rounds_asking_at_once_share_one_client() -> None:
    # A burst of rounds starting together asked an unlocked cache at the same moment, and each
    # miss built its own client (an SSL context and a connection pool each): 200 rounds held
    # 200 clients, about 130 MiB more (bench/concurrency.py).
    barrier = threading.Barrier(32)

    def ask() -> object:
        barrier.wait()
        return client_for("http://127.0.0.1:9/v1", "k", 5.0)

    with ThreadPoolExecutor(max_workers=32) as pool:
        clients = list(pool.map(lambda _: ask(), range(32)))
    assert len({id(client) for client in clients}) == 1
