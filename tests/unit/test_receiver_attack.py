"""The receiver under attack (issue 14): it never destroys or discloses what is not a segment,
validates every tensor before reading any, and bounds what one request can cost."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from smg_grpc_proto.generated import vllm_engine_pb2

from smgshm.core.receiver.reader import ReceiverConfig, receive
from smgshm.core.transport.wire import Layout
from tests.support.receiver_attack import HUGE, _file, _mm, _td


def _receive(cfg: ReceiverConfig, mm: Any) -> dict[str, Any]:
    return {r.key: r for r in receive(Layout.VLLM, mm.SerializeToString(), cfg)}


@pytest.mark.parametrize("shape", [[0], [4]])
def test_a_foreign_file_is_refused_unread_and_kept(tmp_path: Path, shape: list[int]) -> None:
    victim = _file(tmp_path, "victim.dat", b"precious" if shape == [4] else b"")
    n = 4 if shape == [4] else 0
    got = _receive(ReceiverConfig(shm_dir=str(tmp_path)), _mm(_td("victim.dat", n, shape)))
    r = got["pixel_values"]
    assert r.error_code == "foreign_name"
    assert "victim.dat" in r.error_message
    assert str(tmp_path) not in r.error_message
    assert victim.exists()
    assert victim.read_bytes() == (b"precious" if n else b"")


def test_any_name_emulates_smgs_reader_and_consumes_it(tmp_path: Path) -> None:
    victim = _file(tmp_path, "victim.dat", b"abcd")
    got = _receive(ReceiverConfig(shm_dir=str(tmp_path), any_name=True), _mm(_td("victim.dat", 4)))
    assert got["pixel_values"].ok
    assert got["pixel_values"].unlinked
    assert not victim.exists()


def test_errors_name_the_handle_never_server_paths_sizes_or_uids(tmp_path: Path) -> None:
    _file(tmp_path, "smg-tokenspeed-1-2-3", b"x" * 10)  # shorter than its handle says
    os.symlink("/etc/passwd", tmp_path / "smg-tokenspeed-1-2-4")
    mm = _mm(
        _td("smg-tokenspeed-1-2-3", 4096),
        {
            "link": _td("smg-tokenspeed-1-2-4", 4),
            "gone": _td("smg-tokenspeed-1-2-5", 4),
        },
    )
    got = _receive(ReceiverConfig(shm_dir=str(tmp_path)), mm)
    assert [got[k].error_code for k in sorted(got)] == ["missing", "symlink", "short"]
    for r in got.values():
        assert str(tmp_path) not in r.error_message
        assert "uid" not in r.error_message
        assert r.shm_name in r.error_message
    assert "size=10" not in got["pixel_values"].error_message
    assert (tmp_path / "smg-tokenspeed-1-2-3").exists()


@pytest.mark.slow
def test_a_crafted_shape_gets_its_own_receipt_and_good_tensors_arrive(tmp_path: Path) -> None:
    good = _file(tmp_path, "smg-tokenspeed-1-2-3", b"g" * 16)
    crafted = _td("smg-tokenspeed-1-2-9", 0, [0, HUGE, HUGE, HUGE], "float32")
    inline_crafted = vllm_engine_pb2.TensorData(shape=[0, HUGE, HUGE, HUGE], dtype="int64", inline=b"")
    got = _receive(
        ReceiverConfig(shm_dir=str(tmp_path)),
        _mm(_td(good.name, 16), {"crafted": crafted, "inline_crafted": inline_crafted}),
    )
    assert got["pixel_values"].ok
    assert got["pixel_values"].unlinked
    for k in ("model_specific_tensors[crafted]", "model_specific_tensors[inline_crafted]"):
        assert got[k].error_code == "wire"
        assert "overflows" in got[k].error_message


def test_too_many_dimensions_is_refused(tmp_path: Path) -> None:
    td = vllm_engine_pb2.TensorData(shape=[1] * 33, dtype="uint8", inline=b"x")
    assert _receive(ReceiverConfig(shm_dir=str(tmp_path)), _mm(td))["pixel_values"].error_code == "wire"


# --- stalled clients, memory and SIGTERM (a real serve child) ----------------------------------
