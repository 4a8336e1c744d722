"""The cause catalogue: every cause has a code, a sentence and a fix; codes are unique; the README's table matches."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from smgshm.core.causes import CATALOGUE, Cause, Entry, Where, found, no_space, write_failure

README = Path(__file__).resolve().parents[2] / "README.md"
BEGIN = "<!-- causes: generated from smgshm/core/causes.py by tests/unit/test_causes.py render_table(); do not edit -->"
END = "<!-- end of causes -->"


def render_table() -> str:
    """The README's table of causes, from the catalogue (paste between BEGIN and END when a cause is added)."""
    rows = ["| code | meaning | fix | next step (as e2e, watch or doctor name it) |", "|---|---|---|---|"]
    for cause in Cause:
        e = CATALOGUE[cause]
        step = e.next_step(SHAPE)
        shown = f"`{shlex.join(step)}`" if step else ""
        rows.append(f"| `{cause.value}` | {e.meaning} | {e.fix} | {shown} |")
    return "\n".join(rows)


# What the README's table names in each next step: placeholders for the dir, gateway and worker of a run.
SHAPE = Where(shm_dir="DIR", gateway_url="URL", address="ADDRESS")


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
    f = found(Cause.WORKER_UNREACHABLE, "worker 127.0.0.1:9 unreachable: refused", Where(address="127.0.0.1:9"))
    assert (f.code, f.message) == ("worker_unreachable", "worker 127.0.0.1:9 unreachable: refused")
    assert f.fix == CATALOGUE[Cause.WORKER_UNREACHABLE].fix
    assert f.fix_cmd == ["smgshm", "probe", "127.0.0.1:9"]
    plain = found(Cause.MODE_INLINE)
    assert plain.message == CATALOGUE[Cause.MODE_INLINE].meaning
    assert plain.fix_cmd is None


HOSTILE = Where(shm_dir="/tmp/a dir; rm -rf ~", gateway_url="http://h:1/$(id)", address="h:3 `x`")


def test_every_cause_has_one_fix_text_and_one_next_step_builder_in_the_catalogue() -> None:
    import dataclasses

    assert [f.name for f in dataclasses.fields(Entry)] == ["meaning", "fix", "step"]
    for cause in Cause:
        e = CATALOGUE[cause]
        assert callable(e.step), cause
        step = e.next_step(HOSTILE)
        if step is None:
            continue
        # argv: each object it names is one word, whatever it holds, so the shown (shlex-quoted) line
        # acts on that object and nothing else; the words of the fix never carry a second command.
        assert step[0] == "smgshm", cause
        assert shlex.split(shlex.join(step)) == step
        named = {HOSTILE.shm_dir, HOSTILE.gateway_url, HOSTILE.address} & set(step)
        assert len(named) == 1, (cause, step)
        assert "smgshm " not in e.fix, f"{cause.value}: its fix names a command and its next step another"
        assert e.next_step(Where()) is None, f"{cause.value}: a next step naming nothing it was given"


def test_a_next_step_names_what_it_acts_on() -> None:
    d = "/proc/42/root/dev/shm"
    assert CATALOGUE[Cause.SHM_FULL].next_step(Where(d)) == ["smgshm", "gc", "--delete", "--shm-dir", d]
    assert CATALOGUE[Cause.SEGMENTS_LEAKED].next_step(Where(d, assume_dead=True)) == [
        "smgshm", "gc", "--delete", "--shm-dir", d, "--assume-dead"
    ]  # fmt: skip
    url = "http://127.0.0.1:30000"
    assert CATALOGUE[Cause.PRIVATE_TMPFS].next_step(Where(d, url)) == ["smgshm", "probe", "--from-gateway", url]
    # A step that only looks is none for the command already looking: doctor never says "run doctor".
    assert CATALOGUE[Cause.SHM_PERMISSION].next_step(Where(d)) == ["smgshm", "doctor", "--shm-dir", d]
    assert CATALOGUE[Cause.SHM_PERMISSION].next_step(Where(d, running="doctor")) is None
    assert CATALOGUE[Cause.WORKER_UNREACHABLE].next_step(Where(address="h:1", running="probe")) is None
    # An action is said even to the command that found it: rerun the verify once the receiver is fixed.
    verify = CATALOGUE[Cause.VERIFY_FAILED].next_step(Where(address="h:1", running="probe"))
    assert verify == ["smgshm", "probe", "--verify", "h:1"]


def test_no_fix_text_is_written_twice_in_the_code() -> None:
    """One fix text per code: the catalogue's texts are in causes.py only; nothing else spells one out."""
    import ast

    root = Path(__file__).resolve().parents[2] / "smgshm"
    fixes = {e.fix for e in CATALOGUE.values()}
    for path in root.rglob("*.py"):
        if path.name == "causes.py" and path.parent.name == "core":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value not in fixes, f"{path}: a second copy of a catalogue fix"


def test_too_small_is_a_total_below_the_need_whatever_is_free_and_full_only_when_the_total_would_hold_it() -> None:
    mib = 1 << 20
    for free in (0, mib // 2, mib, None):  # an empty 1 MiB tmpfs is as too small as a filled one
        assert no_space(4 * mib, mib) is Cause.SHM_TOO_SMALL
        assert write_failure(4 * mib, mib, free, None) is Cause.SHM_TOO_SMALL
    assert write_failure(mib, 4 * mib, mib // 2, None) is Cause.SHM_FULL
    assert no_space(mib, 4 * mib) is Cause.SHM_FULL
    assert no_space(mib, None) is Cause.SHM_FULL  # a total not known proves nothing too small
    assert write_failure(mib, 4 * mib, 4 * mib, False) is Cause.SHM_PERMISSION


def test_readme_table_matches_the_catalogue() -> None:
    text = README.read_text(encoding="utf-8")
    assert BEGIN in text
    assert END in text
    block = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert block == render_table(), "README's table of causes drifted: paste render_table() between the markers"


# Every cause, and the test that produces it for real (a real process, port, tmpfs or gateway; the real
# gateway where it can be). A cause no code path here can produce carries NOT_PRODUCIBLE and its reason;
# one not produced by a test yet carries NOT_YET and why: each is allowed only where ALLOWED_GAPS says so.
NOT_PRODUCIBLE = "not producible here: "
NOT_YET = "no real test yet: "
PRODUCED_BY: dict[Cause, str] = {
    Cause.OTHER_HOST: "test_cli_e2e.py::test_configured_auto_gone_inline_fails_with_its_cause_and_fix",
    Cause.PRIVATE_TMPFS: "test_cli_probe.py::test_real_private_tmpfs_receiver",
    Cause.ID_SPELLING: "test_cli_probe.py::test_auto_decision_matches_the_gateways_string_equality",
    Cause.NO_NAMESPACE_ID: "test_causes.py::test_no_namespace_id_from_a_vllm_worker_that_advertises_none",
    Cause.LOCAL_ID_UNREADABLE: "test_causes.py::test_namespace_unreadable_when_this_hosts_boot_id_is_empty",
    Cause.MODE_INLINE: "test_cli_e2e.py::test_non_smgshm_worker_verdict_from_metrics_and_shm_dir",
    Cause.BELOW_SHM_MIN_BYTES: "test_causes.py::test_below_shm_min_bytes_at_a_real_gateway_with_a_high_minimum",
    Cause.ENGINE_INLINE_ONLY: "test_causes.py::test_engine_inline_only_for_an_sglang_worker_of_the_real_gateway",
    Cause.SHM_WRITES_FAILING: (
        "test_e2e_causes.py::test_writes_refused_by_permission_are_shm_permission_where_e2e_cannot_write_either"
    ),
    Cause.SHM_FULL: "test_e2e_causes.py::test_a_full_tmpfs_is_shm_full_and_gc_is_the_fix",
    Cause.SHM_TOO_SMALL: "test_e2e_causes.py::test_full_tmpfs_makes_real_writes_fail_and_e2e_says_so",
    Cause.SHM_PERMISSION: (
        "test_e2e_causes.py::test_writes_refused_by_permission_are_shm_permission_where_e2e_cannot_write_either"
    ),
    Cause.GATEWAY_PROBE_FAILED: (
        "test_e2e_causes.py::test_leftover_probe_file_the_gateway_removes_is_named_from_its_log"
    ),
    Cause.PROBE_FILE_LEFT: "test_e2e_causes.py::test_leftover_probe_file_turns_shm_off_and_e2e_names_it",
    Cause.UID_MISMATCH: "test_cli_probe.py::test_uid_mismatch_is_found_by_verify",
    Cause.VERIFY_FAILED: "test_causes.py::test_verify_failed_a_receiver_on_its_own_tmpfs_claiming_this_hosts_id",
    Cause.NOT_GRPC: "test_probe_from_gateway.py::test_dp_rank_http_worker_and_stale_label",
    Cause.WORKER_PROCESSING: "test_causes.py::test_worker_processing_at_a_real_gateway_sending_media_refs_to_serve",
    Cause.NO_MM_TENSORS: "test_causes.py::test_no_mm_tensors_when_every_request_fails_at_a_real_gateway",
    Cause.ZMQ_LANE: "test_causes.py::test_zmq_lane_for_a_worker_the_real_gateway_reaches_over_ipc",
    Cause.WORKER_UNREACHABLE: "test_cli_e2e.py::test_dead_worker_is_the_headline_and_no_latency",
    Cause.GATEWAY_NOT_READY: "test_causes.py::test_gateway_not_ready_and_no_workers_at_a_real_gateway_with_none",
    Cause.INLINE_AGAINST_RULE: NOT_PRODUCIBLE + "e2e names it when the gateway's evidence contradicts its own "
    "logged rule (mode, shm_min_bytes, dev_writable, its own tmpfs, id and engine); the installed gateway followed its "
    "rule in every setup built here (ids, engines, lanes, tmpfs full, too small or read-only, probe files, another "
    "mount namespace), so it guards a gateway that would not",
    Cause.SOME_WORKERS_INLINE: (
        "test_causes.py::test_some_workers_inline_when_one_of_two_workers_is_in_another_namespace"
    ),
    Cause.SOURCES_DISAGREE: "test_causes.py::test_sources_disagree_when_another_gateway_feeds_the_same_worker",
    Cause.NO_EVIDENCE: "test_causes.py::test_no_evidence_for_an_unprivileged_e2e_whose_requests_all_fail",
    Cause.WORKER_SLOW: "test_causes.py::test_worker_slow_when_a_gateways_workers_outlast_doctors_probe_budget",
    Cause.STALE_NAMESPACE_LABEL: "test_causes.py::test_stale_namespace_label_of_a_worker_restarted_with_another_id",
    Cause.WORKERS_UNLISTED: "test_causes.py::test_workers_unlisted_when_the_real_gateway_wants_an_api_key",
    Cause.NO_WORKERS: "test_causes.py::test_gateway_not_ready_and_no_workers_at_a_real_gateway_with_none",
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
    Cause.INLINE_AGAINST_RULE: NOT_PRODUCIBLE,
}


def _test_names(path: Path) -> set[str]:
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_every_cause_is_produced_for_real_by_a_named_test() -> None:
    assert set(PRODUCED_BY) == set(Cause), f"causes without an entry: {set(Cause) - set(PRODUCED_BY)}"
    here = Path(__file__).resolve().parents[1]  # tests/
    for cause, where in PRODUCED_BY.items():
        if where.startswith((NOT_PRODUCIBLE, NOT_YET)):
            marker = NOT_PRODUCIBLE if where.startswith(NOT_PRODUCIBLE) else NOT_YET
            assert ALLOWED_GAPS.get(cause) == marker, f"{cause.value}: a marker where no gap is allowed"
            assert where.removeprefix(marker).strip(), f"{cause.value}: the marker needs its reason"
            continue
        assert cause not in ALLOWED_GAPS, f"{cause.value} has a test now: remove it from ALLOWED_GAPS"
        file, _, name = where.partition("::")
        found = [here / kind / file for kind in ("unit", "integration") if (here / kind / file).is_file()]
        assert found, f"{cause.value}: no {file} in tests/unit or tests/integration"
        assert any(name in _test_names(f) for f in found), f"{cause.value}: no {name} in {file}"


# --------------------------------------------------------------------------- causes produced here for real


# --------------------------------------------------------------------------- a real gateway's own state
