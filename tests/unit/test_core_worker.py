"""serve as a stand-in worker, in-process: the model directory, Generate, receipts and their ring."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.errors import HostError
from smgshm.core.receiver.modeldir import SERVED_MODEL_NAME, ensure_model_dir
from smgshm.core.receiver.reader import Receipt
from smgshm.core.receiver.receipts import (
    GenerateReceipt,
    ReceiptRing,
    from_proto,
    receipt_as,
    to_proto,
)
from smgshm.core.receiver.worker import segment_age_ns

# --- the model directory ---------------------------------------------------------------------


def test_model_dir_is_written_complete_and_its_tokenizer_works(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    md = ensure_model_dir(str(tmp_path / "m"))
    assert md.path == str(tmp_path / "m")
    names = sorted(os.listdir(md.path))
    assert names == sorted(
        [
            "config.json",
            "preprocessor_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
            "special_tokens_map.json",
        ]
    )
    tok = Tokenizer.from_file(os.path.join(md.path, "tokenizer.json"))
    assert tok.token_to_id("<|image_pad|>") == md.image_token_id
    assert tok.token_to_id("<|im_end|>") == md.eos_token_id
    assert tok.token_to_id("<image>") is not None
    # Added tokens are whole tokens; words outside the tiny vocabulary are [UNK], not errors.
    ids = tok.encode("<|im_start|>user describe zebra <image><|im_end|>").ids
    assert ids[0] == tok.token_to_id("<|im_start|>")
    assert tok.token_to_id("<image>") in ids
    assert tok.token_to_id("[UNK]") in ids
    assert tok.get_vocab_size() == md.vocab_size
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["model_type"] == md.model_type == "qwen2_vl"
    assert cfg["vision_token_id"] == md.image_token_id
    assert cfg["vision_config"]["patch_size"] == 14
    tc = json.loads((tmp_path / "m" / "tokenizer_config.json").read_text())
    assert "message['content']" in tc["chat_template"]
    assert "for content" not in tc["chat_template"]
    assert md.served_model_name == SERVED_MODEL_NAME
    assert md.reply_token_id == tok.token_to_id("ok")


def test_model_dir_is_reused_and_an_empty_dir_is_filled(tmp_path: Path) -> None:
    first = ensure_model_dir(str(tmp_path / "m"))
    mtime = os.stat(tmp_path / "m" / "tokenizer.json").st_mtime_ns
    assert ensure_model_dir(str(tmp_path / "m")) == first
    assert os.stat(tmp_path / "m" / "tokenizer.json").st_mtime_ns == mtime
    (tmp_path / "empty").mkdir()
    assert ensure_model_dir(str(tmp_path / "empty")).vocab_size == first.vocab_size
    # No temporary siblings left behind.
    assert sorted(os.listdir(tmp_path)) == ["empty", "m"]


def test_model_dir_refuses_a_foreign_non_empty_dir_and_keeps_it(tmp_path: Path) -> None:
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("keep me")
    with pytest.raises(HostError, match="not a complete model directory"):
        ensure_model_dir(str(d))
    assert os.listdir(d) == ["notes.txt"]
    assert sorted(os.listdir(tmp_path)) == ["mine"]


def test_model_dir_default_lives_under_xdg_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    md = ensure_model_dir()
    assert md.path == str(tmp_path / "smgshm" / "model-qwen2vl-tiny")


def test_racing_writers_both_get_the_directory(tmp_path: Path) -> None:
    got: list[Any] = []
    threads = [threading.Thread(target=lambda: got.append(ensure_model_dir(str(tmp_path / "m")))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == 4
    assert len({g.vocab_size for g in got}) == 1
    assert os.listdir(tmp_path) == ["m"]


# --- the ring --------------------------------------------------------------------------------


def _r(key: str) -> GenerateReceipt:
    return GenerateReceipt(request_id="r", engine="vllm", key=key, payload_kind="inline", dtype="uint8", shape=(1,))


def test_ring_numbers_in_order_and_is_bounded() -> None:
    seen: list[int] = []
    ring = ReceiptRing(size=3, sink=lambda r: seen.append(r.seq))
    ring.add([_r("a"), _r("b")])
    ring.add([_r("c"), _r("d"), _r("e")])
    assert seen == [1, 2, 3, 4, 5]
    got, nxt, dropped = ring.after(0)
    assert [r.seq for r in got] == [3, 4, 5]
    assert (nxt, dropped) == (5, 2)
    got, nxt, dropped = ring.after(3, limit=1)
    assert ([r.key for r in got], nxt, dropped) == (["d"], 4, 0)
    assert ring.after(5) == ([], 5, 0)


def test_one_mapping_carries_a_receipt_through_every_form() -> None:
    from smgshm.rpc.v1 import diag_pb2

    read = Receipt(
        "pixel_values",
        "shm",
        "uint8",
        (2, 2),
        nbytes=4,
        digest=b"d" * 16,
        read_ns=3,
        decode_ns=4,
        unlinked=True,
        shm_name="smg-tokenspeed-1-2-3",
        reader="view",
    )
    refused = Receipt("x", "shm", "uint8", (4,), shm_name="evil", error_code="foreign_name", error_message="no")
    for r in (read, refused):
        g = receipt_as(GenerateReceipt, r, request_id="q", engine="vllm", shm_owner_id="smg:1", received_unix_ns=9)
        assert (g.key, g.shape, g.digest, g.reader, g.error_code) == (r.key, r.shape, r.digest, r.reader, r.error_code)
        assert g.digest_algo == r.digest_algo == ("xxh3_128" if r.digest else "")
        assert from_proto(to_proto(g)) == g
        wire = receipt_as(diag_pb2.TensorReceipt, r)
        assert (list(wire.shape), wire.digest_algo, wire.HasField("error")) == ([*r.shape], g.digest_algo, not r.ok)
    assert to_proto(g).error.code == "foreign_name"
    with pytest.raises(TypeError, match="no field"):
        receipt_as(diag_pb2.TensorReceipt, read, request_id="q")


# --- Generate over gRPC, in-process ----------------------------------------------------------


def test_segment_age_from_the_name() -> None:
    assert segment_age_ns("smg-tokenspeed-12-1000-0", 1500) == 500
    assert segment_age_ns("smg-tokenspeed-12-2000-0", 1500) == 0  # a clock ahead of ours: never negative
    assert segment_age_ns("victim.dat", 1500) == 0
