"""Real multimodal traffic: the real gateway (`smg launch` 1.13.0) sends `smgshm serve` real tensors.

The gateway tokenizes the chat prompt with the weight-less model directory, preprocesses
a real PNG in Rust and sends `pixel_values` in a vLLM (or TokenSpeed) Generate, through
/dev/shm under `shm` and inline under `inline` (smg-facts §5.2). serve's receipts, the
gateway's metrics and the shm dir must all tell the same story.
"""

from __future__ import annotations

import json
import os
import re
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.gateway.metrics import TENSOR_BYTES, TENSORS, scrape
from smgshm.core.gateway.process import GatewayConfig, RunningGateway, start_gateway
from smgshm.core.receiver.modeldir import ensure_model_dir
from smgshm.core.receiver.receipts import GenerateReceipt, fetch_receipts
from smgshm.core.transport.tensors import ITEMSIZE
from tests.conftest import SHM, Children, start_serve, wait_for
from tests.support.interop_generate import chat, png, serve_behind_gateway
from tests.support.schema_check import RECEIPTS, validate

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.gateway,
]


PIXELS_448 = (1024, 1176)  # 448x448 -> 32x32 patches of 14 px, 3x2x14x14 values each


def by_key(receipts: list[GenerateReceipt]) -> dict[str, GenerateReceipt]:
    out = {r.key: r for r in receipts}
    assert len(out) == len(receipts), f"duplicate keys in {[r.key for r in receipts]}"
    return out


def traffic(gw: RunningGateway) -> Any:
    return scrape(gw.metrics_url)


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_shm_transport_delivers_pixel_values_through_dev_shm(
    children: Children, stack: ExitStack, tmp_path: Path, stream: bool
) -> None:
    address, gw, model = serve_behind_gateway(children, stack, tmp_path, "shm")
    before = traffic(gw)
    status, text = chat(gw, model, png(448), stream)
    assert status == 200, text[-2000:]
    if stream:
        assert "data: [DONE]" in text
    else:
        assert json.loads(text)["choices"][0]["finish_reason"] == "stop"
    receipts, nxt = fetch_receipts(address)
    assert nxt == max(r.seq for r in receipts)
    got = by_key(receipts)
    extras = {f"model_specific_tensors[{k}]" for k in ("image_grid_thw", "patches_per_image")}
    assert set(got) == {"pixel_values", *extras}
    pv = got["pixel_values"]
    assert pv.ok, pv.error_message
    assert (pv.payload_kind, pv.dtype, pv.shape, pv.nbytes) == ("shm", "float32", PIXELS_448, 4816896)
    # The gateway's name: its own pid, the nanos it wrote the segment at, a sequence number.
    assert re.fullmatch(rf"smg-tokenspeed-{gw.pid}-\d+-\d+", pv.shm_name), pv.shm_name
    assert pv.shm_owner_id == f"smg:{gw.pid}"
    assert pv.unlinked is True
    assert not os.path.exists(os.path.join(SHM, pv.shm_name))
    assert 0 < pv.age_ns < 60 * 10**9
    assert pv.digest_algo == "xxh3_128"
    assert len(pv.digest) == 16
    for k in ("model_specific_tensors[image_grid_thw]", "model_specific_tensors[patches_per_image]"):
        assert (got[k].payload_kind, got[k].dtype, got[k].ok) == ("inline", "int64", True)
    assert got["model_specific_tensors[image_grid_thw]"].shape == (1, 3)
    assert len({r.request_id for r in receipts}) == 1
    assert receipts[0].request_id
    # The gateway's own account agrees.
    delta = traffic(gw).minus(before)
    assert delta.value(TENSORS, runtime="vllm", path="shm") == 1
    assert delta.value(TENSORS, runtime="vllm", path="inline") == 2
    assert delta.value(TENSOR_BYTES, runtime="vllm", path="shm") == 4816896


@pytest.mark.slow
def test_inline_transport_delivers_everything_inline(children: Children, stack: ExitStack, tmp_path: Path) -> None:
    address, gw, model = serve_behind_gateway(children, stack, tmp_path, "inline")
    before = traffic(gw)
    status, text = chat(gw, model, png(448), stream=False)
    assert status == 200, text[-2000:]
    got = by_key(fetch_receipts(address)[0])
    assert got["pixel_values"].payload_kind == "inline"
    assert (got["pixel_values"].nbytes, got["pixel_values"].shape) == (4816896, PIXELS_448)
    assert (got["pixel_values"].shm_name, got["pixel_values"].age_ns) == ("", 0)
    assert all(r.ok and r.payload_kind == "inline" for r in got.values())
    delta = traffic(gw).minus(before)
    assert delta.value(TENSORS, runtime="vllm", path="inline") == 3
    assert delta.value(TENSORS, runtime="vllm", path="shm") == 0


@pytest.mark.slow
def test_tokenspeed_face_gets_encoder_input_through_shm(children: Children, stack: ExitStack, tmp_path: Path) -> None:
    address, gw, model = serve_behind_gateway(children, stack, tmp_path, "shm", "--engine", "tokenspeed")
    before = traffic(gw)
    status, text = chat(gw, model, png(448), stream=True)
    assert status == 200, text[-2000:]
    got = by_key(fetch_receipts(address)[0])
    enc = got["items[0].encoder_input"]
    assert enc.ok, enc.error_message
    assert enc.engine == "tokenspeed"
    assert enc.payload_kind == "shm"
    assert enc.unlinked
    # TokenSpeed's encoder input travels in the model's dtype (bfloat16 unless told otherwise).
    assert enc.shape == PIXELS_448
    assert enc.nbytes == PIXELS_448[0] * PIXELS_448[1] * ITEMSIZE[enc.dtype]
    assert not os.path.exists(os.path.join(SHM, enc.shm_name))
    assert any(k.startswith("items[0].model_specific_tensors[") for k in got)
    delta = traffic(gw).minus(before)
    assert delta.value(TENSORS, runtime="tokenspeed", path="shm") == 1


@pytest.mark.slow
def test_log_receipts_writes_one_json_line_per_tensor(children: Children, stack: ExitStack, tmp_path: Path) -> None:
    log = tmp_path / "receipts.jsonl"
    _, gw, model = serve_behind_gateway(children, stack, tmp_path, "shm", "--log-receipts", str(log))
    status, _ = chat(gw, model, png(448), stream=False)
    assert status == 200

    def three_lines() -> list[str] | None:  # the log's final state, not the first line that lands
        lines = log.read_text().splitlines() if log.exists() else []
        return lines if len(lines) >= 3 else None

    lines = wait_for(three_lines, 30, "three receipt lines")
    docs = [json.loads(line) for line in lines]
    assert len(docs) == 3
    for d in docs:
        validate(d, RECEIPTS)  # schemas/serve-receipts.schema.json
    assert [d["seq"] for d in docs] == [1, 2, 3]
    pv = next(d for d in docs if d["key"] == "pixel_values")
    assert pv["payload_kind"] == "shm"
    assert pv["unlinked"] is True
    assert pv["shape"] == list(PIXELS_448)
    assert len(bytes.fromhex(pv["digest"])) == 16


@pytest.mark.slow
def test_log_receipts_to_stdout_whose_reader_left_ends_serve_with_141(
    children: Children, stack: ExitStack, tmp_path: Path
) -> None:
    """``serve --log-receipts - | head -1``: the receipt written after the reader left ends serve with
    exit 141 (as every command), the request it served answered, not failed."""
    md = ensure_model_dir(str(tmp_path / "model"))
    p, ready = start_serve(children, "--model-dir", md.path, "--log-receipts", "-")
    assert p.stdout is not None
    assert p.stderr is not None
    p.stdout.close()  # the ready line was read: the reader leaves, as head -1 does
    cfg = GatewayConfig(
        worker_urls=(ready["result"]["address"],),
        model_path=md.path,
        transport="shm",
        log_path=str(tmp_path / "gateway.log"),
    )
    gw = stack.enter_context(start_gateway(cfg, ready_timeout_s=60))
    status, _ = chat(gw, md.served_model_name, png(448), stream=False)
    assert status == 200
    assert p.wait(timeout=60) == 141
    assert "Traceback" not in p.stderr.read()


# --- faults on demand (serve --fault): the gateway's failure classes of smg-facts §5.3 ---------


def gateway_segments(gw: RunningGateway) -> list[str]:
    """The gateway's payload segments in the shm dir right now."""
    return sorted(n for n in os.listdir(SHM) if n.startswith(f"smg-tokenspeed-{gw.pid}-"))


@pytest.mark.slow
def test_die_after_headers_without_retries_leaks_the_segment(
    children: Children, stack: ExitStack, tmp_path: Path
) -> None:
    _, gw, model = serve_behind_gateway(
        children, stack, tmp_path, "shm", "--fault", "die-after-headers", disable_retries=True
    )
    status, text = chat(gw, model, png(448), stream=False)
    assert status == 502, text[-2000:]
    assert "worker_stream_failed" in text
    leaked = gateway_segments(gw)
    try:
        # The worker died holding the handle unread; the gateway relies on the worker to unlink.
        assert len(leaked) == 1, leaked
        assert os.stat(os.path.join(SHM, leaked[0])).st_size == 4816896
    finally:
        for name in leaked:
            os.unlink(os.path.join(SHM, name))


@pytest.mark.slow
def test_die_before_read_leaves_nothing(children: Children, stack: ExitStack, tmp_path: Path) -> None:
    _, gw, model = serve_behind_gateway(
        children, stack, tmp_path, "shm", "--fault", "die-before-read", disable_retries=True
    )
    before = traffic(gw)
    status, text = chat(gw, model, png(448), stream=False)
    assert status >= 500, text[-2000:]
    # The send failed before any header: the gateway's own send-failure cleanup unlinks it.
    wait_for(lambda: not gateway_segments(gw), 30, "the gateway to unlink its segment")
    assert traffic(gw).minus(before).value(TENSORS, runtime="vllm", path="shm") == 1


@pytest.mark.slow
def test_die_after_read_consumed_the_segment_and_logged_it(
    children: Children, stack: ExitStack, tmp_path: Path
) -> None:
    log = tmp_path / "receipts.jsonl"
    _, gw, model = serve_behind_gateway(
        children, stack, tmp_path, "shm", "--fault", "die-after-read", "--log-receipts", str(log), disable_retries=True
    )
    status, text = chat(gw, model, png(448), stream=False)
    assert status >= 500, text[-2000:]
    docs = [json.loads(line) for line in log.read_text().splitlines()]
    pv = next(d for d in docs if d["key"] == "pixel_values")
    assert pv["payload_kind"] == "shm"
    assert pv["unlinked"] is True
    assert gateway_segments(gw) == []


@pytest.mark.slow
def test_slow_read_still_answers_and_the_age_shows_the_wait(
    children: Children, stack: ExitStack, tmp_path: Path
) -> None:
    address, gw, model = serve_behind_gateway(
        children, stack, tmp_path, "shm", "--fault", "slow-read", "--fault-delay", "1s"
    )
    status, text = chat(gw, model, png(448), stream=False)
    assert status == 200, text[-2000:]
    pv = by_key(fetch_receipts(address)[0])["pixel_values"]
    assert pv.unlinked
    # The segment waited at least the delay between the gateway's write and the read.
    assert pv.age_ns >= 10**9
