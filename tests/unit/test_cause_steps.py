"""One path from cause to output: e2e, probe, watch and doctor give a cause the catalogue's next step, filled
in from what each knows (the shm dir, the gateway, the worker); none keeps a command table of its own."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from smgshm.core.causes import CATALOGUE, Cause, Where, found
from smgshm.core.client.probe import LocalChecks, WorkerReport, cause_of
from smgshm.core.e2e.run import E2eOptions, _cause, _Target
from smgshm.core.e2e.verdict import TensorPath, Verdict

CORE = Path(__file__).resolve().parents[2] / "smgshm" / "core"
GATEWAY = "http://127.0.0.1:30000"
SHM_DIR = "/tmp/smgshm unit shm"  # never read: the commands name it


def _e2e(code: Cause, shm_dir: str = SHM_DIR) -> dict[str, object] | None:
    target = _Target("gateway", GATEWAY, f"{GATEWAY}/metrics", None, "auto", None, "vllm", "", [], "")
    verdict = Verdict(TensorPath.INLINE, "the gateway's reason", True, {}, code=code)
    info = _cause(verdict, target, E2eOptions(shm_dir=shm_dir), shm_dir)
    return dataclasses.asdict(info) if info is not None else None


@pytest.mark.parametrize("code", list(Cause))
def test_e2es_json_for_a_cause_carries_the_catalogues_fix_and_command(code: Cause) -> None:
    info = _e2e(code)
    assert info is not None
    assert info["code"] == code.value
    assert info["fix"] == CATALOGUE[code].fix
    step = CATALOGUE[code].next_step(Where(SHM_DIR, GATEWAY, running="e2e"))
    assert info["fix_cmd"] == step


@pytest.mark.parametrize(
    ("verdict", "code"), [("spelling", Cause.ID_SPELLING), ("undetermined", Cause.LOCAL_ID_UNREADABLE)]
)
def test_e2e_and_probe_give_one_command_for_one_cause(verdict: str, code: Cause) -> None:
    """e2e's own table sent a misspelled id to probe --from-gateway, probe sent it to ns: now both say ns."""
    local = LocalChecks("" if code is Cause.LOCAL_ID_UNREADABLE else "ns-a", True, "", [], 1 << 30)
    probed = cause_of(WorkerReport("127.0.0.1:50051", verdict, "the reason"), local, SHM_DIR)
    assert probed is not None
    assert probed.code == code.value
    e2e = _e2e(code)
    assert e2e is not None
    assert probed.fix_cmd == e2e["fix_cmd"] == ["smgshm", "ns", "--shm-dir", SHM_DIR]


def test_a_full_dir_gets_the_gc_that_frees_it_from_e2e_and_watch() -> None:
    """e2e and watch suggested a gc that only lists (smgshm gc) for a full dir: gc --delete frees it."""
    e2e = _e2e(Cause.SHM_FULL)
    assert e2e is not None
    assert e2e["fix_cmd"] == ["smgshm", "gc", "--delete", "--shm-dir", SHM_DIR]


def test_no_core_module_builds_a_command_for_a_cause_of_its_own() -> None:
    """found() takes the caller's knowledge (a Where), never an argv; no module but the catalogue passes one."""
    for path in CORE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "found"):
                continue
            args = [*node.args[2:3], *(k.value for k in node.keywords if k.arg in ("where", "fix_cmd"))]
            for arg in args:
                assert not isinstance(arg, (ast.List, ast.Tuple, ast.ListComp)), f"{path}:{node.lineno}"
                if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name):
                    assert arg.func.id == "Where", f"{path}:{node.lineno}: a command of its own"


def test_doctors_checks_of_a_gateways_workers_quote_nothing_into_their_fix() -> None:
    """A worker URL from the gateway's GET /workers went into the fix's words unquoted (``probe it: smgshm probe
    URL``); it is an argv now, shown shell-quoted, and a slow worker's fix is the catalogue's."""
    from smgshm.core.doctor.gatewayworkers import JudgedGateway, _worker_check
    from smgshm.core.gateway.admin import GatewayWorker

    url = "grpc://h:1;reboot"
    w = GatewayWorker("id", url, "grpc", "vllm", "", True, "ready", "m", "regular", "")
    g = JudgedGateway("gateway 7", GATEWAY, "auto", "")
    slow = _worker_check(g, w, None, False, 5.0)
    assert slow.cause is Cause.WORKER_SLOW
    assert (slow.fix, slow.fix_cmd) == (CATALOGUE[Cause.WORKER_SLOW].fix, ["smgshm", "probe", url])
    skipped = _worker_check(g, w, None, True, 5.0)
    assert url not in skipped.fix
    assert skipped.fix_cmd == ["smgshm", "probe", url]


def _doctor_e2e(monkeypatch: pytest.MonkeyPatch, **run: object) -> list[Any]:
    """doctor's e2e check over one gateway run (e2e itself replaced: no gateway, no request)."""
    from smgshm.core.doctor.e2e import check_e2e

    fields: dict[str, object] = {
        "label": "gateway",
        "metrics_url": f"{GATEWAY}/metrics",
        "shm_tensors_by_source": {},
        "cause": "the gateway's reason",
        "p50_ms": 1.0,
        "unreachable": False,
        "path": "inline",
        "failure_class": "",
        "expected": "",
        "as_expected": True,
        "gateway_log": "",
        "cause_info": None,
    }
    fields.update(run)
    report = SimpleNamespace(runs=[SimpleNamespace(**fields)], embedded=False, removed_at_stop=[], processes_left=[])
    monkeypatch.setattr("smgshm.core.e2e.run.run_against", lambda *_a, **_k: report)
    return [c for c in check_e2e(GATEWAY, None, SimpleNamespace(shm_dir=SHM_DIR), 1.0) if c.name.startswith("e2e ")]  # type: ignore[arg-type]


def test_doctors_e2e_check_gives_the_e2e_cause_with_its_fix_and_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """It said "see the cause; smgshm probe --from-gateway shows each worker" (no URL: not pasteable) whatever
    the cause; now the catalogue's fix and e2e's command for it, never one that only runs doctor again."""
    private = found(Cause.PRIVATE_TMPFS, "worker in another tmpfs", Where(SHM_DIR, GATEWAY, running="e2e"))
    (check,) = _doctor_e2e(monkeypatch, cause_info=private)
    assert (check.status, check.cause) == ("warn", Cause.PRIVATE_TMPFS)
    assert (check.fix, check.fix_cmd) == (
        CATALOGUE[Cause.PRIVATE_TMPFS].fix,
        ["smgshm", "probe", "--from-gateway", GATEWAY],
    )
    failing = found(Cause.SHM_PERMISSION, "refused", Where(SHM_DIR, GATEWAY, running="e2e"))
    (check,) = _doctor_e2e(monkeypatch, cause_info=failing)
    assert (check.fix, check.fix_cmd) == (CATALOGUE[Cause.SHM_PERMISSION].fix, None)  # no command to paste: null
    (check,) = _doctor_e2e(monkeypatch)
    assert check.fix_cmd == ["smgshm", "probe", "--from-gateway", GATEWAY]


# The found() calls that still give a cause a fix of their own, and why: shrink this, never grow it.
OWN_FIX: dict[tuple[str, str], str] = {
    ("node/preflight.py", "PROBE_FILE_LEFT"): "names the proof that failed for this incarnation's probe file",
    ("node/preflight.py", "SHM_TOO_SMALL"): "names the size the pod's /dev/shm needs for its --inflight-bytes",
    ("gateway/rates.py", "MODE_INLINE"): "watch's counters cannot tell mode inline from auto with a foreign worker",
}


def test_a_cause_gets_the_catalogues_fix_but_where_a_reason_is_listed() -> None:
    """watch's leak fix under --assume-dead was a second text for segments_leaked (its wait now in the message)."""
    seen = set()
    for path in CORE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if not any(
            isinstance(n, ast.ImportFrom) and n.module == "smgshm.core.causes" and "found" in {a.name for a in n.names}
            for n in ast.walk(tree)
        ):
            continue  # another module's own found() (gateway/mode.py's findings)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "found"):
                continue
            if len(node.args) < 4 and not any(k.arg == "fix" for k in node.keywords):
                continue
            cause = node.args[0]
            code = cause.attr if isinstance(cause, ast.Attribute) else "?"
            where = (str(path.relative_to(CORE)), code)
            assert where in OWN_FIX, f"{where}: a fix of its own for a cause (the catalogue's is the one)"
            seen.add(where)
    assert seen == set(OWN_FIX), f"listed but gone: {set(OWN_FIX) - seen}"


def test_doctors_namespace_id_check_gives_the_catalogues_fix_and_ns_for_its_dir() -> None:
    """A malformed id had a fix of its own ("check /proc/sys/kernel/random/boot_id (a UUID) and the shm dir")."""
    from smgshm.core.doctor.identity import check_namespace_id
    from smgshm.core.host.identity import HostIdentity

    for ns_id in ("not-an-id", ""):
        ident = HostIdentity(ns_id, "", 0, SHM_DIR, 0, 0, 1, "", "h", 1 << 30, 1 << 30, "tmpfs", "rw")
        c = check_namespace_id(ident, SHM_DIR)
        assert c.cause is Cause.LOCAL_ID_UNREADABLE
        assert (c.fix, c.fix_cmd) == (CATALOGUE[Cause.LOCAL_ID_UNREADABLE].fix, ["smgshm", "ns", "--shm-dir", SHM_DIR])


# The doctor checks that still give a cause a fix text of their own (by module and function), and why: shrink
# this, never grow it. A check's fix is the catalogue's when it is none, or a Found's or an Entry's ``.fix``.
OWN_CHECK_FIX: dict[tuple[str, str], str] = {
    ("doctor/e2e.py", "check_e2e"): "the catalogue's fix followed by the e2e command and gateway log that show it",
    ("doctor/leaks.py", "leak_checks"): "says when gc's command reaps the leaked, and why a stranded one never goes",
    ("doctor/workers.py", "probe_file_checks"): "names the gc command and the pid a leftover probe file waits for",
    ("doctor/workers.py", "check_send"): "the send error's own hint, which says what it ran out of",
    ("doctor/hostchecks.py", "check_capacity"): "per place (FixPlace): a pod's spec, or a remount, sized to the need",
}


def _checks_with_a_cause(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    """(innermost enclosing function, call) of each ``Check(..., cause=...)`` in ``tree``."""
    out: list[tuple[str, ast.Call]] = []

    def visit(node: ast.AST, fn: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fn = node.name
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "Check"
            and any(k.arg == "cause" for k in node.keywords)
        ):
            out.append((fn, node))
        for child in ast.iter_child_nodes(node):
            visit(child, fn)

    visit(tree, "")
    return out


def _catalogues_fix(fix: ast.expr | None) -> bool:
    """None, "", or a Found's or an Entry's ``.fix`` (``CATALOGUE[cause].fix``, ``info.fix``)."""
    if fix is None or (isinstance(fix, ast.Constant) and fix.value == ""):
        return True
    return isinstance(fix, ast.Attribute) and fix.attr == "fix"


def test_a_check_with_a_cause_gets_the_catalogues_fix_but_where_a_reason_is_listed() -> None:
    """doctor --node's writable check named shm_permission with fix texts of its own (one cause, two shapes);
    a Check(cause=..., fix=...) is held to the catalogue's text as found() is."""
    seen = set()
    for path in CORE.rglob("*.py"):
        for fn, call in _checks_with_a_cause(ast.parse(path.read_text(encoding="utf-8"))):
            fix = call.args[3] if len(call.args) > 3 else next((k.value for k in call.keywords if k.arg == "fix"), None)
            if _catalogues_fix(fix):
                continue
            where = (str(path.relative_to(CORE)), fn)
            assert where in OWN_CHECK_FIX, f"{where}, line {call.lineno}: a fix of its own for a cause"
            seen.add(where)
    assert seen == set(OWN_CHECK_FIX), f"listed but gone: {set(OWN_CHECK_FIX) - seen}"


def test_doctor_nodes_writable_check_gives_the_catalogues_fix(tmp_path: Path) -> None:
    """Read-only, or a uid that may not create files: shm_permission, with the catalogue's one fix for it."""
    from smgshm.core.host.identity import HostIdentity
    from smgshm.core.node.doctor import _writable
    from smgshm.core.node.volumes import ShmUser

    d = str(tmp_path)  # only stat'ed: its mode and owner
    tmp_path.chmod(0o755)  # its owner's alone to write
    big = 1 << 30
    for options in ("ro,nosuid", "rw"):
        ident = HostIdentity("", "", 0, d, 0, 0, 1, "", "h", big, big, "tmpfs", options)
        users = (ShmUser(1, "pid:[1]", 1, 4_000_000, None),) if options == "rw" else ()
        c = _writable(d, ident, users)
        assert c.cause is Cause.SHM_PERMISSION, c
        assert (c.fix, c.fix_cmd) == (CATALOGUE[Cause.SHM_PERMISSION].fix, None)
