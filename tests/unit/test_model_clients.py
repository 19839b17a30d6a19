"""The process's shared model clients: one per server and key, kept until closed.

An evicted client that still held pooled sockets left them to the garbage collector, whose
`ResourceWarning` (an error under this suite's filterwarnings) then failed whichever test
happened to be running.
"""

from __future__ import annotations

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
