"""The cause catalogue: every cause has a code, a sentence and a fix; codes are unique; the README's table matches."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.causes import CATALOGUE, Cause, found
from smgshm.core.gateway.process import RunningGateway
from tests.conftest import Children, closed_port, run_cli, start_serve
from tests.e2e_support import gateway, gateways, mm_shm_worker, model_dir, needs_smg

__all__ = ["gateways", "model_dir"]  # fixtures
needs_unshare = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                   reason="needs root and unshare(1)")  # fmt: skip

README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN = "<!-- causes: generated from smgshm/core/causes.py by tests/test_causes.py render_table(); do not edit -->"
END = "<!-- end of causes -->"


def render_table() -> str:
    """The README's table of causes, from the catalogue (paste between BEGIN and END when a cause is added)."""
    rows = ["| code | meaning | fix |", "|---|---|---|"]
    for cause in Cause:
        e = CATALOGUE[cause]
        rows.append(f"| `{cause.value}` | {e.meaning} | {e.fix} |")
    return "\n".join(rows)


def test_every_cause_has_a_code_a_sentence_and_a_fix() -> None:
    assert set(CATALOGUE) == set(Cause)
    for cause in Cause:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", cause.value), cause
        e = CATALOGUE[cause]
        assert e.meaning.strip(), cause
        assert e.fix.strip(), cause
        assert "\n" not in e.meaning + e.fix
        assert "|" not in e.meaning + e.fix


def test_codes_are_unique() -> None:
    codes = [c.value for c in Cause]
    assert len(codes) == len(set(codes))


def test_found_carries_code_message_fix_and_argv() -> None:
    f = found(Cause.WORKER_UNREACHABLE, "worker 127.0.0.1:9 unreachable: refused", ["smgshm", "probe", "127.0.0.1:9"])
    assert (f.code, f.message) == ("worker_unreachable", "worker 127.0.0.1:9 unreachable: refused")
    assert f.fix == CATALOGUE[Cause.WORKER_UNREACHABLE].fix
    assert f.fix_cmd == ["smgshm", "probe", "127.0.0.1:9"]
    plain = found(Cause.MODE_INLINE)
    assert plain.message == CATALOGUE[Cause.MODE_INLINE].meaning
    assert plain.fix_cmd is None


def test_readme_table_matches_the_catalogue() -> None:
    text = README.read_text(encoding="utf-8")
    assert BEGIN in text
    assert END in text
    block = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert block == render_table(), "README's table of causes drifted: paste render_table() between the markers"


def test_probe_json_carries_the_cause_of_an_unreachable_worker() -> None:
    addr = f"127.0.0.1:{closed_port()}"
    doc = run_cli("--json", "probe", "--connect-timeout", "1s", addr, exit=4).json
    [w] = doc["result"]["workers"]
    assert w["cause_info"]["code"] == "worker_unreachable"
    assert w["cause_info"]["message"].startswith(f"{addr}: ")
    assert w["cause_info"]["fix"] == CATALOGUE[Cause.WORKER_UNREACHABLE].fix


# Every cause, and the test that produces it for real (a real process, port, tmpfs or gateway; the real
# gateway where it can be). A cause no code path here can produce carries NOT_PRODUCIBLE and its reason;
# one not produced by a test yet carries NOT_YET and why: each is allowed only where ALLOWED_GAPS says so.
NOT_PRODUCIBLE = "not producible here: "
NOT_YET = "no real test yet: "
PRODUCED_BY: dict[Cause, str] = {
    Cause.OTHER_HOST: "test_cli_e2e.py::test_configured_auto_gone_inline_fails_with_its_cause_and_fix",
    Cause.PRIVATE_TMPFS: "test_cli_probe.py::test_real_private_tmpfs_receiver",
    Cause.ID_SPELLING: "test_cli_probe.py::test_auto_decision_matches_the_gateways_string_equality",
    Cause.NO_NAMESPACE_ID: "test_cli_probe.py::test_sglang_receiver_is_undetermined",
    Cause.LOCAL_ID_UNREADABLE: "test_causes.py::test_namespace_unreadable_when_this_hosts_boot_id_is_empty",
    Cause.MODE_INLINE: "test_cli_e2e.py::test_non_smgshm_worker_verdict_from_metrics_and_shm_dir",
    Cause.BELOW_SHM_MIN_BYTES: "test_causes.py::test_below_shm_min_bytes_at_a_real_gateway_with_a_high_minimum",
    Cause.ENGINE_INLINE_ONLY: NOT_YET + "smgshm serve --engine sglang answers probe's RPCs but not SGLang's Generate "
    "(the real gateway's request fails 501), so no tensor reaches an SGLang worker here",
    Cause.SHM_WRITES_FAILING: NOT_YET + "needs writes that fail with neither too little space nor a permission",
    Cause.SHM_FULL: "test_preflight.py::test_capacity_too_small_full_and_enough",
    Cause.SHM_TOO_SMALL: "test_e2e_causes.py::test_full_tmpfs_makes_real_writes_fail_and_e2e_says_so",
    Cause.SHM_PERMISSION: NOT_YET + "needs an e2e that cannot write the shm dir beside a gateway whose log is unread",
    Cause.GATEWAY_PROBE_FAILED: (
        "test_e2e_causes.py::test_leftover_probe_file_the_gateway_removes_is_named_from_its_log"
    ),
    Cause.PROBE_FILE_LEFT: "test_e2e_causes.py::test_leftover_probe_file_turns_shm_off_and_e2e_names_it",
    Cause.UID_MISMATCH: "test_cli_probe.py::test_uid_mismatch_is_found_by_verify",
    Cause.VERIFY_FAILED: "test_causes.py::test_verify_failed_a_receiver_on_its_own_tmpfs_claiming_this_hosts_id",
    Cause.NOT_GRPC: "test_probe_from_gateway.py::test_dp_rank_http_worker_and_stale_label",
    Cause.WORKER_PROCESSING: NOT_YET + "needs a real gateway under --mm-processing worker",
    Cause.NO_MM_TENSORS: "test_causes.py::test_no_mm_tensors_when_every_request_fails_at_a_real_gateway",
    Cause.ZMQ_LANE: NOT_PRODUCIBLE + "no code path emits it (probe, e2e and doctor never name a ZMQ lane)",
    Cause.WORKER_UNREACHABLE: "test_cli_e2e.py::test_dead_worker_is_the_headline_and_no_latency",
    Cause.GATEWAY_NOT_READY: NOT_PRODUCIBLE + "no code path emits it: a gateway answering 503 is an exit-4 error "
    '("gateway not ready: ..."), not a cause',
    Cause.INLINE_AGAINST_RULE: NOT_YET + "needs a gateway that sends inline while its own rule says shm",
    Cause.SOURCES_DISAGREE: NOT_YET + "needs sources of evidence that disagree for real",
    Cause.NO_EVIDENCE: NOT_YET + "needs e2e with no metrics, no shm dir view and no receipts",
    Cause.WORKER_SLOW: NOT_YET + "needs a worker whose probe outlasts doctor's whole probe budget",
    Cause.STALE_NAMESPACE_LABEL: NOT_YET + "needs a worker re-started with another id behind a live gateway",
    Cause.WORKERS_UNLISTED: NOT_YET + "needs a gateway found here whose GET /workers fails",
    Cause.NO_WORKERS: NOT_YET + "needs a real gateway with no worker registered",
    Cause.MIXED_NAMESPACE_IDS: (
        "test_doctor_workers.py::test_a_foreign_and_a_dead_worker_fail_naming_them_and_the_mixed_ids_warn"
    ),
    Cause.WORKER_OVERRIDE_IGNORED: (
        "test_doctor_workers.py::test_the_lint_names_ignored_overrides_and_a_decode_worker_in_another_namespace"
    ),
    Cause.PD_DECODE_NAMESPACE: (
        "test_doctor_workers.py::test_the_lint_names_ignored_overrides_and_a_decode_worker_in_another_namespace"
    ),
    Cause.SEGMENTS_STRANDED: (
        "test_doctor_workers.py::test_a_segment_stranded_by_a_live_gateway_fails_with_its_bytes_and_the_verdict_comes_first"
    ),
    Cause.SEGMENTS_LEAKED: "test_cli_watch.py::test_consumed_cleaned_and_orphans_with_their_producers",
    Cause.PREFLIGHT_TIMEOUT: "test_preflight.py::test_timeout_fails_with_its_cause",
}
# The causes allowed a marker instead of a test: shrink this as tests land, never grow it without a reason.
ALLOWED_GAPS: dict[Cause, str] = {
    Cause.ZMQ_LANE: NOT_PRODUCIBLE,
    Cause.GATEWAY_NOT_READY: NOT_PRODUCIBLE,
    **{c: NOT_YET for c, where in PRODUCED_BY.items() if where.startswith(NOT_YET)},
}


def _test_names(path: Path) -> set[str]:
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_every_cause_is_produced_for_real_by_a_named_test() -> None:
    assert set(PRODUCED_BY) == set(Cause), f"causes without an entry: {set(Cause) - set(PRODUCED_BY)}"
    here = Path(__file__).resolve().parent
    for cause, where in PRODUCED_BY.items():
        if where.startswith((NOT_PRODUCIBLE, NOT_YET)):
            marker = NOT_PRODUCIBLE if where.startswith(NOT_PRODUCIBLE) else NOT_YET
            assert ALLOWED_GAPS.get(cause) == marker, f"{cause.value}: a marker where no gap is allowed"
            assert where.removeprefix(marker).strip(), f"{cause.value}: the marker needs its reason"
            continue
        assert cause not in ALLOWED_GAPS, f"{cause.value} has a test now: remove it from ALLOWED_GAPS"
        file, _, name = where.partition("::")
        assert (here / file).is_file(), f"{cause.value}: no {file}"
        assert name in _test_names(here / file), f"{cause.value}: no {name} in {file}"


# --------------------------------------------------------------------------- causes produced here for real


def _spawn_json(children: Children, argv: list[str]) -> dict[str, Any]:
    """The first JSON line of a child (a serve's ready document, or a command's whole output)."""
    p = children.spawn(argv)
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line, p.stderr.read() if p.stderr else "exited"
    doc: dict[str, Any] = json.loads(line)
    return doc


@needs_unshare
def test_verify_failed_a_receiver_on_its_own_tmpfs_claiming_this_hosts_id(children: Children) -> None:
    """The ids match (the receiver claims this host's), so only the canary tells: it is not there."""
    from smgshm.core.host.namespace import read_namespace_id

    script = ('mount -t tmpfs -o size=4m tmpfs /dev/shm && exec "$0" -m smgshm --json serve --listen 127.0.0.1:0 '
              '--advertise-namespace-id "$1"')  # fmt: skip
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, sys.executable, read_namespace_id()]
    addr = _spawn_json(children, argv)["result"]["address"]
    [w] = run_cli("--json", "probe", "--verify", addr, exit=3).json["result"]["workers"]
    assert w["verdict"] == "verify_failed"
    assert w["cause_info"]["code"] == "verify_failed"
    assert w["cause_info"]["fix_cmd"] == ["smgshm", "probe", "--verify", addr]


@needs_unshare
def test_namespace_unreadable_when_this_hosts_boot_id_is_empty(children: Children, tmp_path: Path) -> None:
    """probe where /proc/sys/kernel/random/boot_id reads empty: this host's id cannot be formed."""
    _, ready = start_serve(children)
    addr = ready["result"]["address"]
    fake = tmp_path / "boot_id"
    fake.write_text("", encoding="ascii")
    script = f'mount --bind {fake} /proc/sys/kernel/random/boot_id && exec "$0" -m smgshm --json probe "$1"'
    doc = _spawn_json(children, ["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                                 sys.executable, addr])  # fmt: skip
    [w] = doc["result"]["workers"]
    assert w["verdict"] == "undetermined"
    assert w["cause_info"]["code"] == "namespace_unreadable"
    assert w["cause_info"]["fix_cmd"][:2] == ["smgshm", "ns"]


def _e2e_run(gw: RunningGateway, *args: str, exit: int) -> dict[str, Any]:
    argv = ["--json", "e2e", "--gateway", gw.http_url, "--metrics", gw.metrics_url, "-n", "1", "--warmup", "0", *args]
    [run] = run_cli(*argv, exit=exit).json["result"]["runs"]
    return run  # type: ignore[no-any-return]


@needs_smg
@pytest.mark.timeout(180)
def test_below_shm_min_bytes_at_a_real_gateway_with_a_high_minimum(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """A gateway whose shm_min_bytes (64 MiB) exceeds every tensor: inline by design, no failure under shm."""
    gw = gateway(gateways, tmp_path, model_dir, mm_shm_worker(children, model_dir), mode="shm",
                 shm_min_bytes=64 << 20)  # fmt: skip
    run = _e2e_run(gw, exit=0)
    assert run["path"] == "inline"
    assert run["cause_info"]["code"] == "below_shm_min_bytes"


@needs_smg
@pytest.mark.timeout(180)
def test_no_mm_tensors_when_every_request_fails_at_a_real_gateway(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """A model the gateway does not serve: every request fails before any tensor is sent."""
    gw = gateway(gateways, tmp_path, model_dir, mm_shm_worker(children, model_dir), mode="shm")
    run = _e2e_run(gw, "--model", "no-such-model", exit=3)
    assert run["path"] == "none"
    assert run["cause_info"]["code"] == "no_mm_tensors"
