"""``smgshm watch`` on the real /dev/shm while the real gateway (`smg launch`) sends real tensors.

The gateway writes `pixel_values` to `smg-tokenspeed-<its pid>-<nanos>-<seq>` and `smgshm
serve` (the stand-in vLLM worker) reads and unlinks it. watch follows only that gateway's
names (--prefix with its pid), since other tests' traffic shares /dev/shm; what it says
must agree with serve's receipts and with the gateway's own counters (--metrics).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.gateway.metrics import scrape
from smgshm.core.receiver.receipts import fetch_receipts
from tests.conftest import SHM, Children, smgshm_argv, wait_for
from tests.support.cli_watch import drain
from tests.support.interop_generate import chat, png, serve_behind_gateway

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.gateway,
]

PIXEL_BYTES = 4816896  # 448x448 -> float32 [1024, 1176]


class Watch:
    """``watch --jsonl`` as a child; records are read as they come."""

    def __init__(self, children: Children, *args: str) -> None:
        self.p = children.spawn(smgshm_argv("watch", "--jsonl", *args))
        self.records: list[dict[str, Any]] = []
        self.until(lambda: any(r["type"] == "rescanned" for r in self.records))

    def until(self, pred: Any) -> None:
        assert self.p.stdout is not None
        while not pred():
            line = self.p.stdout.readline()
            assert line, f"watch ended early: {self.p.stderr.read() if self.p.stderr else ''}"
            self.records.append(json.loads(line))

    def stop(self) -> dict[str, Any]:
        os.kill(self.p.pid, signal.SIGINT)
        out, err = drain(self.p)
        assert self.p.returncode == 0, err
        self.records += [json.loads(line) for line in out.splitlines()]
        summary = self.records[-1]
        assert summary["type"] == "summary"
        return summary

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["type"] == kind]


@pytest.mark.slow
def test_watch_follows_the_gateways_segments_and_agrees_with_receipts(
    children: Children,
    stack: ExitStack,
    tmp_path: Path,
) -> None:
    address, gw, model = serve_behind_gateway(children, stack, tmp_path, "shm")
    w = Watch(children, "--prefix", f"smg-tokenspeed-{gw.pid}-", "--interval", "0.5", "--metrics", gw.metrics_url)
    image, n = png(448), 4
    for _ in range(n):
        status, text = chat(gw, model, image, stream=False)
        assert status == 200, text[-2000:]
    receipts = [r for r in fetch_receipts(address)[0] if r.key == "pixel_values"]
    assert len(receipts) == n
    names = {r.shm_name for r in receipts}
    w.until(lambda: len([s for s in w.of("segment") if s["name"] in names]) == n)
    # Intervals until the gateway's counters, scraped each interval, show all n requests.
    w.until(lambda: sum(i["gateway"]["tensors"].get("shm", 0) for i in w.of("interval") if i["gateway"]) == n)
    summary = w.stop()

    segs = {s["name"]: s for s in w.of("segment")}
    assert set(segs) == names, "watch saw exactly the gateway's segments"
    for r in receipts:
        s = segs[r.shm_name]
        assert (s["kind"], s["producer_pid"], s["end"], s["reads"], s["observed"]) == (
            "gateway",
            gw.pid,
            "consumed",
            1,
            True,
        )
        assert s["nbytes"] in (None, PIXEL_BYTES)
        assert not os.path.exists(os.path.join(SHM, r.shm_name))
    # Time in flight: watch's (creation to unlink, as it read the events) against serve's
    # age_ns (receipt time minus the nanos the gateway put in the name): the same span, seen
    # by two clocks; they agree within the scheduling noise of a shared 2-core machine.
    watch_ms = statistics.median(segs[r.shm_name]["in_flight_ns"] / 1e6 for r in receipts)
    receipt_ms = statistics.median(r.age_ns / 1e6 for r in receipts)
    assert abs(watch_ms - receipt_ms) <= max(100.0, 0.5 * receipt_ms), (watch_ms, receipt_ms)
    # The reader's open is after the creation and no later than the receipt (+ event latency).
    for r in receipts:
        s = segs[r.shm_name]
        assert s["created_ns"] <= s["first_read_ns"] <= s["removed_ns"]
    assert summary["consumed"] == n
    assert summary["ends_by_kind"]["gateway"]["consumed"] == n
    assert summary["flight"]["count"] == n
    assert summary["orphans_seen"] == 0
    # The gateway's own counters, side by side: n SHM tensors, 2n small ones inline.
    gwr = summary["gateway"]
    assert gwr["tensors"] == {"shm": n, "inline": 2 * n}
    assert gwr["nbytes"]["shm"] == n * PIXEL_BYTES
    assert gwr["shm_byte_share"] > 0.99
    assert gwr["eligible_inline"] is False
    assert gwr["verdict"] == ""


@pytest.mark.slow
def test_inline_transport_is_said_plainly(children: Children, stack: ExitStack, tmp_path: Path) -> None:
    _, gw, model = serve_behind_gateway(children, stack, tmp_path, "inline")
    w = Watch(
        children,
        "--prefix",
        f"smg-tokenspeed-{gw.pid}-",
        "--interval",
        "0.5",
        "--metrics",
        gw.metrics_url,
        "--serve-metrics",
        "0",
    )
    w.until(lambda: bool(w.of("exporter")))
    status, text = chat(gw, model, png(448), stream=False)
    assert status == 200, text[-2000:]
    w.until(lambda: any(i["gateway"] and i["gateway"]["tensors"].get("inline") for i in w.of("interval")))
    # The exporter says it too, for a fleet's alert: eligible tensors went inline, no byte via SHM.
    exported = scrape(w.of("exporter")[0]["url"])
    assert exported.value("smgshm_watch_gateway_eligible_inline") == 1.0
    assert exported.value("smgshm_watch_gateway_shm_byte_ratio") == 0.0
    summary = w.stop()
    gwr = next(i["gateway"] for i in w.of("interval") if i["gateway"] and i["gateway"]["tensors"].get("inline"))
    assert gwr["tensors"] == {"inline": 3}
    assert gwr["eligible_inline"] is True
    assert "SHM-eligible tensors went inline" in gwr["verdict"]
    assert gwr["shm_byte_share"] == 0.0
    assert summary["created"] == 0, "no segment of this gateway's under inline"
    assert summary["gateway"]["eligible_inline"] is True
    # The human line says it too.
    res = subprocess.run(
        smgshm_argv(
            "watch",
            "--prefix",
            f"smg-tokenspeed-{gw.pid}-",
            "--count",
            "2",
            "--interval",
            "0.5",
            "--metrics",
            gw.metrics_url,
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert "gateway:" in res.stdout


@pytest.mark.slow
def test_segments_nobody_unlinks_are_orphans_of_a_live_gateway(
    children: Children,
    stack: ExitStack,
    tmp_path: Path,
) -> None:
    # A worker that reads but never unlinks (TOKENSPEED_UNLINK_MM_SHM_AFTER_READ=0): the
    # gateway relies on the worker to unlink on success, so its segments stay.
    address, gw, model = serve_behind_gateway(children, stack, tmp_path, "shm", "--keep-segments")
    w = Watch(children, "--prefix", f"smg-tokenspeed-{gw.pid}-", "--interval", "0.3", "--orphan-after", "1s", "--check")
    status, text = chat(gw, model, png(448), stream=False)
    assert status == 200, text[-2000:]
    (r,) = [r for r in fetch_receipts(address)[0] if r.key == "pixel_values"]
    assert r.unlinked is False
    w.until(lambda: any(o["name"] == r.shm_name for o in w.of("orphan")))
    (o,) = [o for o in w.of("orphan") if o["name"] == r.shm_name]
    assert (o["kind"], o["producer_pid"], o["producer_alive"], o["reads"]) == ("gateway", gw.pid, True, 1)
    assert o["state"] in ("in_flight", "unknown")  # gc: a live producer's young segment (unknown where pids mislead)
    assert o["nbytes"] == PIXEL_BYTES
    os.kill(w.p.pid, signal.SIGINT)
    drain(w.p)
    assert w.p.returncode == 3, "--check: an orphan was seen"
    os.unlink(os.path.join(SHM, r.shm_name))
    wait_for(lambda: not os.path.exists(os.path.join(SHM, r.shm_name)), 30, "the kept segment gone")
