"""Addresses are read in one place (smgshm/core/address.py): ports, host:port, gRPC targets, URLs, loopback.

The commands' behaviour on bad addresses (exit 2 at the option, a peer's bad address refused before
it is dialled) is tested end to end in test_cli_serve.py, test_cli_watch.py, test_receiver_limits.py
and test_hostile_http.py; these are the rules themselves.
"""

from __future__ import annotations

import pytest

from smgshm.core.address import (
    UrlError,
    bound_address,
    dial_host,
    grpc_host_port,
    grpc_target,
    is_local_url,
    is_loopback,
    is_loopback_host,
    parse_listen,
    parse_port,
    parse_url,
    split_host_port,
    url_host,
)


@pytest.mark.parametrize("text", ["0", "65536", "99999", "-1", "http", "٣", " 80", ""])
def test_a_port_is_ascii_digits_in_range(text: str) -> None:
    with pytest.raises(ValueError, match="port"):
        parse_port(text)


def test_port_zero_only_where_listening() -> None:
    assert parse_port("0", listen=True) == 0
    assert parse_port("65535") == 65535


@pytest.mark.parametrize(
    ("address", "want"),
    [("127.0.0.1:50051", ("127.0.0.1", 50051)), ("[::1]:80", ("::1", 80)), ("host:1", ("host", 1)), (":9", ("", 9))],
)
def test_split_host_port(address: str, want: tuple[str, int]) -> None:
    assert split_host_port(address) == want


@pytest.mark.parametrize("address", ["host", "::1:80", "[::1:80", "h:99999"])
def test_split_host_port_refuses(address: str) -> None:
    with pytest.raises(ValueError, match="port"):
        split_host_port(address)


def test_grpc_forms() -> None:
    assert grpc_target(" grpc://10.0.0.1:50051/x@3 ") == "10.0.0.1:50051"
    assert grpc_target("unix:/run/w.sock") == "unix:/run/w.sock"
    assert grpc_host_port("unix:/run/w.sock") is None
    assert grpc_host_port("worker") is None  # gRPC's default port
    assert grpc_host_port("worker:1") == ("worker", 1)
    with pytest.raises(ValueError, match="has no port"):
        grpc_host_port("worker", listen=True)


def test_listen_and_bound() -> None:
    assert parse_listen("0") == ("127.0.0.1", 0)
    assert parse_listen(":9100") == ("127.0.0.1", 9100)
    assert parse_listen("[::]:9100") == ("::", 9100)
    assert bound_address("127.0.0.1:0", 4242) == "127.0.0.1:4242"
    assert bound_address("[::1]:0", 4242) == "[::1]:4242"
    assert bound_address("unix:/x", 0) == "unix:/x"


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("unix:/run/w.sock", True),
        ("127.0.0.1:50051", True),
        ("127.3.4.5:1", True),
        ("[::1]:50051", True),
        ("localhost:1", True),
        ("0.0.0.0:50051", False),  # every interface is not loopback
        ("[::]:1", False),
        (":50051", False),
        ("10.0.0.1:1", False),
        ("127.example.com:1", False),  # a name that starts like a loopback address is still a name
    ],
)
def test_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_loopback_host_takes_brackets_or_not() -> None:
    assert is_loopback_host("::1")
    assert is_loopback_host("[::1]")
    assert is_loopback_host("localhost")
    assert not is_loopback_host("")
    assert not is_loopback_host("0.0.0.0")  # noqa: S104


def test_hosts_in_urls() -> None:
    assert url_host("::1") == "[::1]"
    assert url_host("10.0.0.1") == "10.0.0.1"
    assert dial_host("0.0.0.0") == "127.0.0.1"  # noqa: S104
    assert dial_host("::") == "[::1]"
    assert dial_host("fe80::1") == "[fe80::1]"


def test_parse_url() -> None:
    u = parse_url("127.0.0.1:30000/v1/models?x=é")
    assert (u.url, u.scheme, u.host, u.port, u.target) == (
        "http://127.0.0.1:30000/v1/models?x=é",
        "http",
        "127.0.0.1",
        30000,
        "/v1/models?x=%C3%A9",
    )
    assert parse_url("https://[::1]").port == 443


@pytest.mark.parametrize(
    "url", ["ftp://h/", "http://", "http://h:0/", "http://h:65536/", "http://[::1/", "http://h/ x", "http://h\t/"]
)
def test_parse_url_refuses(url: str) -> None:
    with pytest.raises(UrlError):
        parse_url(url)


def test_local_urls() -> None:
    assert is_local_url("http://127.0.0.1:1/")
    assert is_local_url("localhost:1")
    assert not is_local_url("not a url")
