"""What a peer can cost serve and watch (issue 21): every address checked before it is bound or
dialed, watchers capped and pushed to, the metrics exporter's clients bounded, the tensor cap
counted as on the wire, memory given back after a large request, and no wedge at the fd limit."""

from __future__ import annotations

import pytest

from smgshm.core.errors import TransportError
from tests.conftest import run_cli

# --- addresses: a port is 1..65535 (0 for any where listening), never taken modulo 65536 --------


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1:99999", "127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1:http", "127.0.0.1:\u00b2", "[::1:5", "127.0.0.1"],
)
def test_serve_refuses_a_listen_address_it_would_not_bind_as_given(address: str) -> None:
    res = run_cli("serve", "--listen", address, exit=2)
    error = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert len(error) == 1, res.stderr
    assert "--listen" in error[0]


@pytest.mark.parametrize(
    "args",
    [
        ["send", "127.0.0.1:99999"],
        ["probe", "127.0.0.1:50051", "grpc://127.0.0.1:70000"],
        ["bench", "127.0.0.1:-1"],
        ["doctor", "--worker", "127.0.0.1:http"],
        ["watch", "--serve-metrics", "99999", "--count", "1"],
        ["watch", "--serve-metrics", "127.0.0.1:\u00b2", "--count", "1"],
    ],
)
def test_every_address_option_refuses_a_bad_port_as_a_usage_error(args: list[str]) -> None:
    res = run_cli(*args, exit=2)
    assert "Error: Invalid value for" in res.stderr


def test_start_receiver_refuses_a_port_out_of_range() -> None:
    from smgshm.core.receiver.reader import ReceiverConfig
    from smgshm.core.receiver.services import start_receiver

    with pytest.raises(TransportError, match="out of range"):
        start_receiver(ReceiverConfig(), "127.0.0.1:99999")


# --- WatchReceipts: capped, bounded in time, pushed to (an idle watch costs no CPU) ------------


# --- watch --serve-metrics: each client bounded in time, their number capped ------------------


# --- the tensor cap counts what is on the wire: a map key given N times is N tensors ------------


# --- memory: a large request's is given back, and peaks do not ratchet --------------------------


# --- descriptors: silent connections never keep a client out for long -------------------------
