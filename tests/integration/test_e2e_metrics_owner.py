"""e2e reads the tested gateway's own metrics, never a neighbour's: a real gateway on non-default ports,
a decoy /metrics on port 29000 (SMG's default) or wherever --metrics points."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from smgshm.core.e2e.owner import own_metrics
from smgshm.core.errors import TransportError
from smgshm.core.gateway.metrics import DEFAULT_METRICS_PORT, scrape
from smgshm.core.gateway.process import GatewayConfig, RunningGateway, start_gateway
from tests.conftest import Children, LoopbackHttp, closed_port, run_cli
from tests.support.e2e import mm_shm_worker, needs_smg
from tests.support.json_schema import check_e2e_schema

pytestmark = [needs_smg, pytest.mark.timeout(180)]


class Decoy:
    """A busy neighbour's /metrics on loopback: SMG's families, tensors all "shm", and a request counter
    that moves by 10 at every scrape (its own traffic, unknown routes included)."""

    def __init__(self, port: int) -> None:
        self.hits = 0
        self.http = LoopbackHttp(self._page, content_type="text/plain", port=port)
        self.url = f"{self.http.base}/metrics"

    def _page(self, _path: str) -> bytes:
        self.hits += 1
        n = self.hits
        return (
            f'smg_mm_tensors_total{{runtime="vllm",path="shm"}} {n * 10}\n'
            f'smg_mm_tensor_bytes_total{{runtime="vllm",path="shm"}} {n * 4816896}\n'
            f'smg_http_requests_total{{method="GET",path="other"}} {n * 10}\n'
        ).encode()

    def close(self) -> None:
        self.http.close()


@pytest.fixture(scope="module")
def real(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    """One real gateway (shm) on free ports, its metrics port not 29000, with a worker smgshm did not write."""
    children = Children()
    try:
        addr = mm_shm_worker(children, model_dir)
        log = tmp_path_factory.mktemp("gw") / "gateway.log"
        with start_gateway(
            GatewayConfig(worker_urls=(addr,), model_path=model_dir, transport="shm", log_path=str(log)),
            ready_timeout_s=60,
        ) as gw:
            assert not gw.metrics_url.endswith(f":{DEFAULT_METRICS_PORT}/metrics")
            yield gw
    finally:
        children.reap()


@pytest.fixture
def decoy() -> Iterator[Decoy]:
    """On port 29000 when it is free (where e2e looked by default); else on a free port."""
    try:
        d = Decoy(DEFAULT_METRICS_PORT)
    except OSError:
        d = Decoy(0)
    yield d
    d.close()


def chats(gw: RunningGateway) -> float:
    return scrape(gw.metrics_url).value("smg_http_requests_total", method="POST", path="/v1/chat/completions")


@pytest.mark.slow
def test_no_flag_uses_the_gateways_own_metrics_port(real: RunningGateway, decoy: Decoy) -> None:
    doc = run_cli("--json", "e2e", "--gateway", real.http_url, "-n", "1", "--warmup", "0", "--expect", "shm").json
    check_e2e_schema(doc)
    [run] = doc["result"]["runs"]
    assert run["metrics_url"] == real.metrics_url
    assert run["metrics"]["url"] == real.metrics_url
    assert run["metrics"]["owner"] == f"the metrics port of gateway pid {real.pid} itself"
    assert run["metrics"]["tensors"] == {"shm": 1, "inline": 2}  # its own, not the decoy's
    # The human output says whose counters they are, as --json does.
    text = run_cli("e2e", "--gateway", real.http_url, "-n", "1", "--warmup", "0", "--expect", "shm").stdout
    assert f"metrics {real.metrics_url} (the metrics port of gateway pid {real.pid} itself): " in text
    assert decoy.hits == 0


@pytest.mark.slow
def test_metrics_another_process_serves_are_refused_before_any_request(real: RunningGateway, decoy: Decoy) -> None:
    before = chats(real)
    res = run_cli("e2e", "--gateway", real.http_url, "--metrics", decoy.url, "-n", "1", "--warmup", "0", exit=4)
    assert "not by the gateway" in res.stderr
    assert f"--metrics {real.metrics_url}" in res.stderr  # the hint names its own
    assert decoy.hits == 0  # refused by who listens there: never read
    assert chats(real) == before  # no chat request was sent


@pytest.mark.slow
def test_a_remote_gateways_metrics_are_taken_only_once_they_count_smgshms_requests(
    real: RunningGateway, decoy: Decoy
) -> None:
    """As for a remote gateway (no pid to look at): the challenge proves its own endpoint, refuses a busy
    decoy's (whose counters move, though not with smgshm's requests) and one where nothing listens."""
    owned = own_metrics(real.http_url, None, lambda: "", real.metrics_url)
    assert owned.url == real.metrics_url
    assert "counted exactly smgshm's" in owned.owner
    with pytest.raises(TransportError, match=r"cannot tell that .* is this gateway's metrics") as err:
        own_metrics(real.http_url, None, lambda: "", decoy.url)
    assert "--metrics URL" in (err.value.hint or "")
    assert decoy.hits >= 2
    with pytest.raises(TransportError, match="cannot read the gateway's metrics") as err:
        own_metrics(real.http_url, None, lambda: "", f"http://127.0.0.1:{closed_port()}/metrics")
    assert "--metrics URL" in (err.value.hint or "")


@pytest.mark.slow
def test_doctors_e2e_hint_names_the_metrics_it_found() -> None:
    from smgshm.core.doctor.hostchecks import _e2e_hint

    hint = _e2e_hint("http://127.0.0.1:1234", "http://127.0.0.1:5678/metrics")
    assert hint == "smgshm e2e --gateway http://127.0.0.1:1234 --metrics http://127.0.0.1:5678/metrics"
