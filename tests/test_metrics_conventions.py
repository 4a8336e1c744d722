"""Every exposition smgshm writes, judged by real ``promtool check metrics`` and by the same rules here.

``exposition_problems`` is the judge: promtool where it is installed, and always this module's own
rule checker (Prometheus's conventions as promtool lints them, and the project's: no gauge that
repeats a rate, ratios end in ``_ratio``, units last), so a machine without promtool still checks
them. Judged: ``watch --serve-metrics`` at its first scrape, idle after an interval, and under
real traffic (segments written and read in a private tmpfs, a loopback gateway ``/metrics``
beside it); gc's textfile after a real ``--delete`` and after a failed run. README's metrics
tables are checked against the catalogues (``export.METRICS``, ``textfile.METRICS``, the node's
``metrics.METRICS``), and the expositions against them (the node's in test_node_exporter.py).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.names import KINDS
from smgshm.core.node import metrics as node_metrics
from smgshm.core.segments import textfile
from smgshm.core.segments.judge import State, Tally
from smgshm.core.segments.reaping import KEPT_REASONS, ReapReport
from smgshm.core.segments.scan import Deletion
from smgshm.core.watch import export
from smgshm.core.watch.life import ENDS
from tests.conftest import Children, LoopbackHttp, make_file, run_cli, smgshm_argv, wait_for
from tests.test_cli_gc import dead_pid, seg_name
from tests.test_core_shmwatch import tmpfs  # noqa: F401 - the private tmpfs fixture

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
PROMTOOL = shutil.which("promtool")

# -- the judge -------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?[ \t]+(\S+)(?:[ \t]+-?\d+)?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_SNAKE = re.compile(r"^[a-z_][a-z0-9_]*$")
_SUFFIXES = {
    "counter": ("",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
}
_NON_BASE = {
    "milliseconds",
    "microseconds",
    "nanoseconds",
    "minutes",
    "hours",
    "days",
    "kilobytes",
    "megabytes",
    "gigabytes",
    "kibibytes",
    "mebibytes",
    "gibibytes",
    "percent",
    "percentage",
}
_UNITS = {"seconds", "bytes"}
_RATIO_WORDS = {"share", "fraction", "ratio"}


@dataclass
class Family:
    name: str
    type: str | None = None
    help: str | None = None
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)


def parse(text: str) -> tuple[dict[str, Family], list[str]]:
    """The families of a text exposition (by their declared name), and what could not be read."""
    fams: dict[str, Family] = {}
    problems: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith(("# HELP ", "# TYPE ")):
            name, _, rest = line[7:].partition(" ")
            fam = fams.setdefault(name, Family(name))
            if line.startswith("# HELP "):
                problems += [f"{name}: HELP twice"] if fam.help is not None else []
                fam.help = rest
            else:
                problems += [f"{name}: TYPE after its samples"] if fam.samples else []
                fam.type = rest.strip()
            continue
        if line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            problems.append(f"unreadable line {line!r}")
            continue
        name, body, raw = m.groups()
        labels: dict[str, str] = {}
        rest = body or ""
        while rest.strip():
            lm = _LABEL.match(rest)
            if not lm:
                problems.append(f"{name}: unreadable labels {body!r}")
                break
            if lm.group(1) in labels:
                problems.append(f"{name}: label {lm.group(1)} twice")
            labels[lm.group(1)] = lm.group(2)
            rest = rest[lm.end() :]
        try:
            value = float(raw)
        except ValueError:
            problems.append(f"{name}: value {raw!r} is no number")
            continue
        fam = _family_of(name, fams)
        if fam is None:
            problems.append(f"{name}: a sample with no TYPE before it")
            fam = fams.setdefault(name, Family(name))
        fam.samples.append((name, labels, value))
    return fams, problems


def _family_of(name: str, fams: dict[str, Family]) -> Family | None:
    for suffix in ("", "_bucket", "_sum", "_count"):
        base = name[: -len(suffix)] if suffix else name
        fam = fams.get(base)
        if fam is not None and fam.type is not None and suffix in _SUFFIXES.get(fam.type, ("",)):
            return fam
    return None


def rule_problems(text: str) -> list[str]:
    """What breaks Prometheus's conventions (and this project's) in ``text``; [] when none."""
    from prometheus_client.parser import text_string_to_metric_families

    fams, problems = parse(text)
    try:
        list(text_string_to_metric_families(text))
    except Exception as err:  # any failure of the reference parser is the finding
        problems.append(f"prometheus_client's parser refuses it: {err}")
    series: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    for name, fam in fams.items():
        problems += _family_problems(name, fam, series)
    return problems


def _family_problems(name: str, fam: Family, series: set[tuple[str, frozenset[tuple[str, str]]]]) -> list[str]:
    problems: list[str] = []

    def say(what: str) -> None:
        problems.append(f"{name}: {what}")

    if not fam.help:
        say("no HELP text")
    if fam.type not in _SUFFIXES:
        say(f"no TYPE, or an untyped one ({fam.type})")
        return problems
    for what in _name_problems(name, fam.type):
        say(what)
    labelsets = _sample_problems(name, fam, series, problems)
    if len({ls for sets in labelsets.values() for ls in sets}) > 1:
        say(f"samples with different label names: {labelsets}")
    if fam.type == "histogram":
        problems += _histogram_problems(fam)
    if fam.type == "summary" and not {"_sum", "_count"} <= set(labelsets):
        say("a summary without _sum and _count")
    return problems


def _name_problems(name: str, kind: str) -> list[str]:
    """What a family's name breaks of the conventions: snake_case, base units, the unit last, _ratio, _total."""
    out: list[str] = []
    if not _SNAKE.match(name):
        out.append("not snake_case")
    words = name.split("_")
    if set(words) & _NON_BASE:
        out.append(f"a non-base unit ({sorted(set(words) & _NON_BASE)}): use seconds, bytes, ratios")
    if "per" in words and ("second" in words or "seconds" in words):
        out.append("a rate as a metric: export the counter and let rate() divide")
    if set(words) & _RATIO_WORDS and words[-1] != "ratio":
        out.append("a ratio whose name does not end in _ratio")
    core = words[:-1] if words[-1] == "total" else words
    if set(core[:-1]) & _UNITS and core[-1] != "ratio":
        out.append("its unit is not the last word of its name (before _total)")
    if kind == "counter":
        if not name.endswith("_total"):
            out.append('a counter without the "_total" suffix')
    elif name.endswith("_total"):
        out.append('a non-counter with the "_total" suffix')
    if kind in ("counter", "gauge") and name.endswith(("_bucket", "_sum", "_count")):
        out.append("a _bucket/_sum/_count name on a non-histogram")
    return out


def _sample_problems(
    name: str, fam: Family, series: set[tuple[str, frozenset[tuple[str, str]]]], problems: list[str]
) -> dict[str, set[frozenset[str]]]:
    """What each sample breaks, added to ``problems``; the label names of each kind of sample (its suffix)."""
    labelsets: dict[str, set[frozenset[str]]] = {}
    for sname, labels, value in fam.samples:
        key = (sname, frozenset(labels.items()))
        if key in series:
            problems.append(f"{sname}: a series twice ({labels})")
        series.add(key)
        said = [
            f"label {label!r} is not snake_case"
            for label in labels
            if not _SNAKE.match(label) or label.startswith("__")
        ]
        if "quantile" in labels and not (fam.type == "summary" and sname == name):
            said.append('a "quantile" label off a summary\'s quantile samples')
        if "le" in labels and not (fam.type == "histogram" and sname == name + "_bucket"):
            said.append('an "le" label off a histogram\'s buckets')
        if fam.type == "counter" and not (math.isfinite(value) and value >= 0):
            said.append(f"a counter at {value}")
        if fam.type == "summary" and sname == name:
            q = labels.get("quantile")
            if q is None or not 0 <= float(q) <= 1:
                said.append(f"a summary sample without a quantile in [0, 1] ({labels})")
        problems += [f"{name}: {what}" for what in said]
        kind = sname[len(name) :]
        labelsets.setdefault(kind, set()).add(frozenset(labels) - {"le", "quantile"})
    return labelsets


def _histogram_problems(fam: Family) -> list[str]:
    out: list[str] = []
    groups: dict[frozenset[tuple[str, str]], list[tuple[float, float]]] = {}
    counts: dict[frozenset[tuple[str, str]], float] = {}
    for sname, labels, value in fam.samples:
        rest = frozenset((k, v) for k, v in labels.items() if k != "le")
        if sname.endswith("_bucket"):
            groups.setdefault(rest, []).append((float(labels["le"]), value))
        elif sname.endswith("_count"):
            counts[rest] = value
    for rest, buckets in groups.items():
        buckets.sort()
        if buckets[-1][0] != math.inf:
            out.append(f"{fam.name}: no +Inf bucket")
        if any(b[1] < a[1] for a, b in itertools.pairwise(buckets)):
            out.append(f"{fam.name}: buckets not cumulative")
        if counts.get(rest) != buckets[-1][1]:
            out.append(f"{fam.name}: _count is not the +Inf bucket")
    return out


def promtool_problems(text: str) -> list[str]:
    """``promtool check metrics`` on ``text``: its complaints, [] when it passes or is not installed."""
    if PROMTOOL is None:
        return []
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    if r.returncode == 0:
        return []
    return [f"promtool: {line}" for line in (r.stdout + r.stderr).splitlines() if line.strip()] or [
        f"promtool: exit {r.returncode}"
    ]


def exposition_problems(text: str) -> list[str]:
    """The judge: promtool where it is installed, and the rule checker always."""
    return promtool_problems(text) + rule_problems(text)


# A clean exposition, then one broken way per case (the rule it breaks, promtool's verdict).
CLEAN = """# HELP x_things_total Things.
# TYPE x_things_total counter
x_things_total{kind="a"} 0.0
# HELP x_wait_seconds Waits.
# TYPE x_wait_seconds summary
x_wait_seconds{quantile="0.5"} NaN
x_wait_seconds_count 0.0
x_wait_seconds_sum 0.0
"""
PLANTED = [
    ('# HELP x_q_seconds q\n# TYPE x_q_seconds gauge\nx_q_seconds{quantile="0.5"} 1\n', "quantile", True),
    ("# HELP x_things t\n# TYPE x_things counter\nx_things 1\n", "_total", True),
    ("# TYPE x_things_total counter\nx_things_total 1\n", "no HELP", True),
    ("# HELP x_wait_milliseconds w\n# TYPE x_wait_milliseconds gauge\nx_wait_milliseconds 1\n", "non-base", True),
    ("# HELP x_made_per_second m\n# TYPE x_made_per_second gauge\nx_made_per_second 1\n", "rate", False),
    ("# HELP x_shm_byte_share s\n# TYPE x_shm_byte_share gauge\nx_shm_byte_share 1\n", "_ratio", False),
    ("# HELP x_bytes_ended_total b\n# TYPE x_bytes_ended_total counter\nx_bytes_ended_total 1\n", "unit", False),
    ('# HELP x_n n\n# TYPE x_n gauge\nx_n{a="1"} 1\nx_n{b="1"} 1\n', "different label names", False),
]


def test_the_judge_passes_a_clean_exposition() -> None:
    assert exposition_problems(CLEAN) == []


@pytest.mark.parametrize(("text", "rule", "promtool_too"), PLANTED)
def test_the_judge_sees_a_planted_violation(text: str, rule: str, promtool_too: bool) -> None:
    assert any(rule in p for p in rule_problems(text)), rule_problems(text)
    if promtool_too and PROMTOOL is not None:
        assert promtool_problems(text), f"promtool let {rule} through"


# -- the README's tables -----------------------------------------------------------------------

Catalogue = dict[str, tuple[str, tuple[str, ...], str]]  # exposed name -> (type, labels with shm_dir, when)


def _watch_catalogue() -> Catalogue:
    return {export.PREFIX + n: (t, ("shm_dir", *ls), w) for n, (t, ls, w, _) in export.METRICS.items()}


def _gc_catalogue() -> Catalogue:
    return {f"smgshm_gc_{n}": (t, ("shm_dir", *ls), w) for n, (t, ls, w, _) in textfile.METRICS.items()}


def _node_catalogue() -> Catalogue:
    return {node_metrics.PREFIX + n: (t, ls, w) for n, (t, ls, w, _) in node_metrics.METRICS.items()}


def _readme_rows(prefix: str) -> Catalogue:
    rows: Catalogue = {}
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        if line.startswith(f"| `{prefix}"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            name, typ, labels, when = cells[0].strip("`"), cells[1], cells[2], cells[3]
            assert name not in rows, f"README lists {name} twice"
            names = () if labels in ("", "-") else tuple(x.strip().strip("`") for x in labels.split(","))
            rows[name] = (typ, names, when)
    return rows


@pytest.mark.parametrize(
    ("prefix", "catalogue"),
    [("smgshm_watch_", _watch_catalogue), ("smgshm_gc_", _gc_catalogue), ("smgshm_node_", _node_catalogue)],
)
def test_the_readme_tables_list_the_catalogue(prefix: str, catalogue: Any) -> None:
    assert _readme_rows(prefix) == catalogue()


def _agrees(text: str, catalogue: Catalogue) -> set[str]:
    """The families of ``text``, each checked against ``catalogue`` (type and label names)."""
    fams, _ = parse(text)
    for name, fam in fams.items():
        assert name in catalogue, f"{name} is exposed but not in the catalogue (nor README)"
        typ, labels, _ = catalogue[name]
        assert fam.type == typ, (name, fam.type, typ)
        for sname, got, _ in fam.samples:
            want = set(labels) - ({"le"} if not sname.endswith("_bucket") else set())
            want -= {"quantile"} if sname != name else set()
            assert set(got) == want, (sname, set(got), want)
    return set(fams)


def _when(catalogue: Catalogue, *whens: str) -> set[str]:
    return {n for n, (_, _, w) in catalogue.items() if w in whens}


# -- watch ---------------------------------------------------------------------------------------


class WatchChild:
    """``watch --jsonl --serve-metrics`` as a child, its records read by a thread (a busy run
    writes a record per segment: unread, the pipe would fill and stop it)."""

    def __init__(self, children: Children, *args: str) -> None:
        self.p = children.spawn(smgshm_argv("watch", "--jsonl", "--serve-metrics", "127.0.0.1:0", *args))
        self.records: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()
        exporter = wait_for(
            lambda: next((r for r in list(self.records) if r["type"] == "exporter"), None), 60, "watch's exporter"
        )
        self.url: str = exporter["url"]

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.records.append(json.loads(line))

    def scrape(self) -> str:
        with urllib.request.urlopen(self.url, timeout=10) as r:  # noqa: S310 - our own loopback exporter
            text: str = r.read().decode("utf-8")
        return text

    def intervals(self) -> int:
        return sum(1 for r in list(self.records) if r["type"] == "interval")


def _values(text: str, name: str) -> dict[frozenset[tuple[str, str]], float]:
    fams, _ = parse(text)
    fam = _family_of(name, fams)
    assert fam is not None, f"no {name} in the exposition"
    return {frozenset((k, v) for k, v in ls.items() if k != "shm_dir"): v for n, ls, v in fam.samples if n == name}


def test_watch_first_scrape_has_every_labelled_counter_at_0_and_idle_passes(tmpfs: str, children: Children) -> None:  # noqa: F811
    w = WatchChild(children, "--shm-dir", tmpfs, "--interval", "1")
    first = w.scrape()
    assert exposition_problems(first) == []
    cat = _watch_catalogue()
    exposed = _agrees(first, cat)
    assert _when(cat, export.ALWAYS) <= exposed <= _when(cat, export.ALWAYS, export.AFTER_INTERVAL)
    # Every labelled counter, every label value, at 0: rate() and increase() see the first burst.
    for name in ("smgshm_watch_segments_created_total", "smgshm_watch_created_bytes_total"):
        assert _values(first, name) == {frozenset({("kind", k)}): 0.0 for k in KINDS}, name
    for name in ("smgshm_watch_segments_ended_total", "smgshm_watch_ended_bytes_total"):
        want = {frozenset({("kind", k), ("end", e)}): 0.0 for k in KINDS for e in ENDS}
        assert _values(first, name) == want, name
    quantiles = _values(first, "smgshm_watch_interval_time_in_flight_seconds")
    assert set(quantiles) == {frozenset({("quantile", q)}) for q in export.QUANTILES}
    assert all(math.isnan(v) for v in quantiles.values()), "no interval yet: no quantile"
    # Idle, after intervals: the gauges are there too, the quantiles still NaN (none ended).
    wait_for(lambda: w.intervals() >= 2, 60, "two idle intervals")
    idle = w.scrape()
    assert exposition_problems(idle) == []
    assert _agrees(idle, cat) == _when(cat, export.ALWAYS, export.AFTER_INTERVAL)
    assert all(math.isnan(v) for v in _values(idle, "smgshm_watch_interval_time_in_flight_seconds").values())


# Writes N segments that a reader (this process, reopening each by name) consumes, then M it unlinks
# itself, a short pause in each so that watch reads the sizes; then says "done".
TRAFFIC = r"""
import os, sys, time
from smgshm.core.segments.io import read_segment, write_segment
d, consumed, cleaned = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
pid = os.getpid()
for i in range(consumed + cleaned):
    ref = write_segment(b"\x07" * 50_000, shm_dir=d, name=f"smg-smgshm-{pid}-{time.time_ns()}-{i}")
    time.sleep(0.02)
    if i < consumed:
        read_segment(ref.name, 0, ref.nbytes, shm_dir=d).release()
    else:
        os.unlink(ref.path)
print("done", flush=True)
"""


def _gateway_metrics() -> Iterator[bytes]:
    """A gateway's /metrics whose counters grow at each scrape: SHM and inline tensors."""
    n = 0
    while True:
        n += 1
        yield (
            "# TYPE smg_mm_tensors_total counter\n"
            f'smg_mm_tensors_total{{runtime="vllm",path="shm"}} {3 * n}\n'
            f'smg_mm_tensors_total{{runtime="vllm",path="inline"}} {n}\n'
            "# TYPE smg_mm_tensor_bytes_total counter\n"
            f'smg_mm_tensor_bytes_total{{runtime="vllm",path="shm"}} {3_000_000 * n}\n'
            f'smg_mm_tensor_bytes_total{{runtime="vllm",path="inline"}} {1000 * n}\n'
        ).encode()


def test_watch_under_traffic_passes_and_agrees_with_the_catalogue(tmpfs: str, children: Children) -> None:  # noqa: F811
    pages = _gateway_metrics()
    lock = threading.Lock()

    def answer(_path: str) -> bytes:
        with lock:
            return next(pages)

    with LoopbackHttp(answer) as gw:
        w = WatchChild(children, "--shm-dir", tmpfs, "--interval", "0.25", "--metrics", f"{gw.base}/metrics")
        before = w.scrape()
        prod = children.spawn([PY, "-c", TRAFFIC, tmpfs, "150", "20"])
        cat = _watch_catalogue()
        judged: list[str] = []

        # Scrape while the traffic flows, judging every scrape, until one was taken while the last
        # interval carried consumed segments (the state promtool once rejected) with every family.
        def busy_scrape() -> str | None:
            text = w.scrape()
            judged.append(text)
            assert exposition_problems(text) == [], text
            q = _values(text, "smgshm_watch_interval_time_in_flight_seconds") if "interval_time" in text else {}
            full = _agrees(text, cat) == set(cat)
            return text if full and q and not any(math.isnan(v) for v in q.values()) else None

        busy = wait_for(busy_scrape, 120, "a scrape with the last interval's quantiles and every family")
        assert prod.stdout is not None
        assert prod.stdout.readline().strip() == "done", prod.stderr.read() if prod.stderr else ""
        assert prod.wait(timeout=30) == 0
        # Every life ended and counted: then the last scrape is checked too.
        final = wait_for(
            lambda: (lambda t: t if sum(_values(t, "smgshm_watch_segments_ended_total").values()) >= 170 else None)(
                w.scrape()
            ),
            60,
            "170 ended segments",
        )
    assert exposition_problems(final) == []
    q = _values(busy, "smgshm_watch_interval_time_in_flight_seconds")
    assert 0 < q[frozenset({("quantile", "0.5")})] <= q[frozenset({("quantile", "1")})]
    ended = _values(final, "smgshm_watch_segments_ended_total")
    assert ended[frozenset({("kind", "smgshm"), ("end", "consumed")})] == 150
    assert ended[frozenset({("kind", "smgshm"), ("end", "cleaned")})] == 20
    assert (
        _values(before, "smgshm_watch_segments_ended_total")[frozenset({("kind", "smgshm"), ("end", "consumed")})] == 0
    )
    ended_bytes = _values(final, "smgshm_watch_ended_bytes_total")
    assert 0 < ended_bytes[frozenset({("kind", "smgshm"), ("end", "consumed")})] <= 150 * 50_000
    counts = _values(final, "smgshm_watch_interval_time_in_flight_seconds_count")
    assert counts == {frozenset(): 150.0}, "the summary's _count is the run's consumed segments"
    ratio = _values(final, "smgshm_watch_gateway_shm_byte_ratio")[frozenset()]
    assert ratio == pytest.approx(3_000_000 / 3_001_000)
    assert len(judged) >= 1


# -- gc's textfile -------------------------------------------------------------------------------


def test_gc_textfile_after_a_real_delete(children: Children, tmp_path: Path) -> None:
    d = tmp_path / "shm"
    d.mkdir()
    pid, old = dead_pid(children), time.time_ns() - 7200 * 10**9
    for i in range(2):  # leaked and old: reclaimed
        make_file(str(d), seg_name(pid, nanos=old, seq=i), size=8192, age_s=7200)
    make_file(str(d), seg_name(pid, seq=5), size=4096)  # leaked but young: kept, too_young
    root = os.geteuid() == 0
    if root:  # another user's, and gc runs as root without --all-users: kept, other_user
        os.chown(make_file(str(d), seg_name(pid, nanos=old, seq=6), size=4096, age_s=7200), 65534, 65534)
    prom = tmp_path / "gc.prom"
    t0 = time.time()
    doc = run_cli(
        "--json",
        "gc",
        "--shm-dir",
        str(d),
        "--assume-dead",
        "--delete",
        "--min-age",
        "10m",
        "--yes",
        "--prometheus",
        str(prom),
    ).json
    t1 = time.time()
    assert sum(x["deleted"] for x in doc["result"]["deleted"]) == 2
    text = prom.read_text(encoding="utf-8")
    assert exposition_problems(text) == []
    cat = _gc_catalogue()
    assert _agrees(text, cat) == set(cat)
    one = lambda name: _values(text, name)[frozenset()]  # noqa: E731
    assert t0 <= one("smgshm_gc_last_run_timestamp_seconds") <= t1
    assert 0 <= one("smgshm_gc_last_run_duration_seconds") <= t1 - t0
    assert one("smgshm_gc_last_run_success") == 1
    states = [s.value for s in State]
    reclaimed = _values(text, "smgshm_gc_reclaimed_segments")
    assert reclaimed == {frozenset({("state", s)}): (2.0 if s == "leaked" else 0.0) for s in states}
    assert _values(text, "smgshm_gc_reclaimed_bytes")[frozenset({("state", "leaked")})] >= 2 * 8192
    assert one("smgshm_gc_freed_bytes") >= 2 * 8192
    kept = _values(text, "smgshm_gc_kept_segments")
    want = {"too_young": 1.0, "other_user": 1.0 if root else 0.0}
    assert kept == {frozenset({("reason", r)}): want.get(r, 0.0) for r in KEPT_REASONS}
    assert _values(text, "smgshm_gc_segments")[frozenset({("state", "leaked")})] == 2
    assert one("smgshm_gc_shm_free_bytes") > 0


def test_a_failed_gc_run_says_so_with_its_time_and_no_figures(tmp_path: Path) -> None:
    prom = tmp_path / "gc.prom"
    t0 = time.time()
    res = run_cli("gc", "--shm-dir", str(tmp_path / "no-such-dir"), "--prometheus", str(prom), exit=5)
    assert "shm dir does not exist" in res.stderr
    text = prom.read_text(encoding="utf-8")
    assert exposition_problems(text) == []
    cat = _gc_catalogue()
    assert _agrees(text, cat) == _when(cat, textfile.ALWAYS), "no figures: zeros would lie"
    assert _values(text, "smgshm_gc_last_run_success")[frozenset()] == 0
    assert _values(text, "smgshm_gc_last_run_timestamp_seconds")[frozenset()] >= t0


def test_a_segment_that_could_not_be_set_aside_is_a_failed_run() -> None:
    # The one kept reason that is a failure to do what was asked (a rename refused, say EPERM);
    # the others are gc's checks keeping their promise.
    report = ReapReport(
        [Deletion("smg-x", 4096, False, "cannot set it aside atomically: EPERM", 1, kept="set_aside_failed")],
        Tally(),
        Tally(),
        0,
        1 << 20,
        set(),
    )
    text = textfile.textfile_text(textfile.RunRecord("gc", "/dev/shm", 1.0, 2.0, report)).decode()
    assert exposition_problems(text) == []
    assert _values(text, "smgshm_gc_last_run_success")[frozenset()] == 0
    assert _values(text, "smgshm_gc_kept_segments")[frozenset({("reason", "set_aside_failed")})] == 1
    assert _values(text, "smgshm_gc_last_run_duration_seconds")[frozenset()] == 1.0
    kept_by_a_check = ReapReport(
        [Deletion("smg-x", 4096, False, "opened or mapped since the scan", 1, kept="opened_since_scan")],
        Tally(),
        Tally(),
        0,
        1 << 20,
        set(),
    )
    text = textfile.textfile_text(textfile.RunRecord("gc", "/dev/shm", 1.0, 2.0, kept_by_a_check)).decode()
    assert _values(text, "smgshm_gc_last_run_success")[frozenset()] == 1
