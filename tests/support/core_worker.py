"""Shared by the tests of core_worker (moved out of tests/test_core_worker.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from smgshm.core.receiver.modeldir import ensure_model_dir
from smgshm.core.receiver.reader import ReceiverConfig
from smgshm.core.receiver.services import RunningReceiver, start_receiver


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return ensure_model_dir(str(tmp_path_factory.mktemp("model") / "m")).path


@pytest.fixture
def vllm(model: str) -> Iterator[RunningReceiver]:
    r = start_receiver(ReceiverConfig(model_dir=model), "127.0.0.1:0")
    yield r
    r.stop(0)
