"""SMG's transport decision (smg-facts §2.3) as smgshm models it, branch by branch."""

from __future__ import annotations

import pytest

from smgshm.core.gateway.setting import DEFAULT_SHM_MIN_BYTES, Mode, parse_mode
from smgshm.core.transport.decision import Decision, decide

A = "5ef74ec3-1111-4000-8000-000000000000"
B = "5ef74ec3-2222-4000-8000-000000000000"
HERE = f"{A}:27"
BIG = 1 << 20


def _decide(mode: Mode, **kw: object) -> Decision:
    args: dict[str, object] = {
        "nbytes": BIG,
        "engine": "vllm",
        "local_ns": HERE,
        "worker_ns": HERE,
        "writable": True,
    }
    args.update(kw)
    return decide(mode, **args)  # type: ignore[arg-type]


def test_default_threshold_is_64_kib() -> None:
    assert DEFAULT_SHM_MIN_BYTES == 65536


@pytest.mark.parametrize("mode", [Mode.INLINE, Mode.RDMA])
def test_inline_and_rdma_never_use_shm(mode: Mode) -> None:
    d = _decide(mode)
    assert d.path == "inline"
    assert not d.shm
    assert mode.value in d.reason


@pytest.mark.parametrize("engine", ["vllm", "tokenspeed"])
@pytest.mark.parametrize("mode", [Mode.SHM, Mode.AUTO])
def test_shm_engines_get_shm(engine: str, mode: Mode) -> None:
    d = _decide(mode, engine=engine)
    assert d.path == "shm"
    assert d.shm
    assert d.reason.startswith(f"{mode.value}:")


@pytest.mark.parametrize("engine", ["sglang", "trtllm", "mlx"])
@pytest.mark.parametrize("mode", [Mode.SHM, Mode.AUTO])
def test_other_engines_stay_inline(engine: str, mode: Mode) -> None:
    d = _decide(mode, engine=engine)
    assert d.path == "inline"
    assert engine in d.reason
    assert "inline only" in d.reason


@pytest.mark.parametrize("mode", [Mode.SHM, Mode.AUTO])
def test_not_over_grpc_stays_inline(mode: Mode) -> None:
    d = _decide(mode, over_grpc=False)
    assert not d.shm
    assert "inline only" in d.reason


def test_auto_with_matching_ids() -> None:
    d = _decide(Mode.AUTO)
    assert d.shm
    assert "namespace ids match" in d.reason


def test_auto_with_a_different_host() -> None:
    d = _decide(Mode.AUTO, worker_ns=f"{B}:27")
    assert not d.shm
    assert d.reason.startswith("auto:")
    assert "boot ids differ" in d.reason


def test_auto_with_a_private_tmpfs() -> None:
    d = _decide(Mode.AUTO, worker_ns=f"{A}:31")
    assert not d.shm
    assert "different tmpfs" in d.reason


@pytest.mark.parametrize(("local", "worker"), [(HERE, ""), ("", HERE), ("", ""), (HERE, "garbage")])
def test_auto_with_empty_or_bad_ids(local: str, worker: str) -> None:
    d = _decide(Mode.AUTO, local_ns=local, worker_ns=worker)
    assert d.path == "inline"
    assert d.reason.startswith("auto:")


def test_shm_mode_ignores_the_namespace() -> None:
    """`shm` is an operator assertion: no namespace check, as in SMG."""
    d = _decide(Mode.SHM, local_ns=HERE, worker_ns=f"{B}:99")
    assert d.shm
    assert "asserts" in d.reason
    assert _decide(Mode.SHM, local_ns="", worker_ns="").shm


@pytest.mark.parametrize("mode", [Mode.SHM, Mode.AUTO])
def test_unwritable_shm_stays_inline(mode: Mode) -> None:
    d = _decide(mode, writable=False)
    assert not d.shm
    assert "writability probe" in d.reason


@pytest.mark.parametrize("mode", [Mode.SHM, Mode.AUTO])
def test_size_rule_default_threshold(mode: Mode) -> None:
    below = _decide(mode, nbytes=DEFAULT_SHM_MIN_BYTES - 1)
    assert not below.shm
    assert "below shm_min_bytes" in below.reason
    assert str(DEFAULT_SHM_MIN_BYTES - 1) in below.reason
    at = _decide(mode, nbytes=DEFAULT_SHM_MIN_BYTES)
    assert at.shm
    assert f">= {DEFAULT_SHM_MIN_BYTES}" in at.reason


@pytest.mark.parametrize(
    ("nbytes", "minimum", "shm"), [(99, 100, False), (100, 100, True), (0, 0, True), (0, 1, False)]
)
def test_size_rule_custom_threshold(nbytes: int, minimum: int, shm: bool) -> None:
    assert _decide(Mode.SHM, nbytes=nbytes, shm_min_bytes=minimum).shm is shm


def test_namespace_mismatch_is_reported_before_size() -> None:
    d = _decide(Mode.AUTO, worker_ns=f"{B}:27", nbytes=1)
    assert "boot ids differ" in d.reason


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("inline", Mode.INLINE),
        ("shm", Mode.SHM),
        ("auto", Mode.AUTO),
        ("rdma", Mode.RDMA),
        (" AUTO ", Mode.AUTO),
        ("Shm\n", Mode.SHM),
        ("\tRdMa", Mode.RDMA),
    ],
)
def test_parse_mode_known(text: str, mode: Mode) -> None:
    assert parse_mode(text) is mode


@pytest.mark.parametrize("text", ["bogus", "", "   ", None, "shm,auto", "in line", "nixl"])
def test_parse_mode_unknown_or_empty(text: str | None) -> None:
    assert parse_mode(text) is None


@pytest.mark.parametrize("worker", [f"{A.upper()}:27", f"{A}:027", f"{A}:27 "], ids=["upper", "zero", "space"])
def test_auto_compares_ids_as_exact_strings_like_the_gateway(worker: str) -> None:
    """SMG's worker_matches_shm_namespace is `!id.is_empty() && id == local`: no normalising."""
    d = _decide(Mode.AUTO, local_ns=HERE, worker_ns=worker)
    assert d.path == "inline"
    assert "strings" in d.reason
