"""The cause catalogue: every cause has a code, a sentence and a fix; codes are unique; the README's table matches."""

from __future__ import annotations

import re
from pathlib import Path

from smgshm.core.causes import CATALOGUE, Cause, found
from tests.conftest import closed_port, run_cli

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
