"""core/gateway/http.py and core/gateway/metrics.py on text and URLs: parsing, bounds and refusals."""

from __future__ import annotations

from smgshm.core.gateway.metrics import default_metrics_url, mm_traffic, parse_metrics
from tests.support.gateway_http_metrics import SAMPLE


def test_parse_and_summarise_smg_counters() -> None:
    t = mm_traffic(parse_metrics(SAMPLE))
    assert t.tensors == {"shm": 1, "inline": 2}
    assert t.nbytes["shm"] == 4816896
    assert t.shm_write_failures == 0
    assert t.processing == {"router": 1}
    assert t.exported
    assert t.shm_byte_share is not None
    assert t.shm_byte_share > 0.99


def test_chat_answers_are_counted_with_their_errors() -> None:
    page = (
        'smg_http_responses_total{path="/v1/chat/completions",status_code="200",error_code=""} 5\n'
        'smg_http_responses_total{path="/v1/chat/completions",status_code="400",error_code="x"} 2\n'
        'smg_http_responses_total{path="/v1/chat/completions",status_code="503",error_code="y"} 1\n'
        'smg_http_responses_total{path="/workers",status_code="404",error_code=""} 9\n'
    )
    t = mm_traffic(parse_metrics(page))
    assert (t.chat_responses, t.chat_errors) == (8, 3)


def test_delta_counts_new_series_from_zero() -> None:
    before = parse_metrics('smg_mm_tensors_total{runtime="vllm",path="inline"} 2\n')
    after = parse_metrics(SAMPLE)
    d = mm_traffic(after.minus(before))
    assert d.tensors == {"shm": 1, "inline": 0}


def test_no_mm_counters_is_not_exported() -> None:
    t = mm_traffic(parse_metrics("# TYPE up gauge\nup 1\n"))
    assert not t.exported
    assert t.total_tensors == 0


def test_default_metrics_url() -> None:
    assert default_metrics_url("http://127.0.0.1:30000") == "http://127.0.0.1:29000/metrics"
    assert default_metrics_url("gw.local:8080/v1") == "http://gw.local:29000/metrics"
    assert default_metrics_url("http://[::1]:30000") == "http://[::1]:29000/metrics"
