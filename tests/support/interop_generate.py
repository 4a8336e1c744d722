"""Shared by the tests of interop_generate (moved out of tests/test_interop_generate.py)."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from smgshm.core.gateway.http import request
from smgshm.core.gateway.process import GatewayConfig, RunningGateway, start_gateway
from smgshm.core.receiver.modeldir import ensure_model_dir
from tests.conftest import Children, start_serve


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    """Gateways entered here are stopped (group SIGTERM, SIGKILL, reaped) at teardown."""
    with ExitStack() as s:
        yield s


def png(size: int) -> bytes:
    """A real PNG with some structure (a gradient), made with Pillow."""
    from PIL import Image

    img = Image.new("RGB", (size, size))
    img.putdata([(x % 256, y % 256, (x + y) % 256) for y in range(size) for x in range(size)])
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def chat(gw: RunningGateway, model: str, image: bytes, stream: bool) -> tuple[int, str]:
    """One OpenAI chat completion with the image as a data URL: (HTTP status, body)."""
    b64 = base64.b64encode(image).decode()
    body = {
        "model": model,
        "max_tokens": 4,
        "stream": stream,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "describe this image"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64}"}},
                ],
            }
        ],
    }
    resp = request(
        "POST",
        f"{gw.http_url}/v1/chat/completions",
        headers={"content-type": "application/json"},
        body=json.dumps(body).encode(),
        deadline_s=60,
    )
    return resp.status, resp.text()


def serve_behind_gateway(
    children: Children,
    stack: ExitStack,
    tmp_path: Path,
    transport: str,
    *serve_args: str,
    disable_retries: bool = False,
) -> tuple[str, RunningGateway, str]:
    """A serve with the model dir and a gateway in front of it: (serve address, gateway, model name)."""
    md = ensure_model_dir(str(tmp_path / "model"))
    _, ready = start_serve(children, "--model-dir", md.path, *serve_args)
    address = ready["result"]["address"]
    assert ready["result"]["served_model_name"] == md.served_model_name
    cfg = GatewayConfig(
        worker_urls=(address,),
        model_path=md.path,
        transport=transport,
        disable_retries=disable_retries,
        log_path=str(tmp_path / "gateway.log"),
    )
    gw = stack.enter_context(start_gateway(cfg, ready_timeout_s=60))
    return address, gw, md.served_model_name
