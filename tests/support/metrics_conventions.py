"""Shared by the tests of metrics_conventions (moved out of tests/test_metrics_conventions.py)."""

from __future__ import annotations

import itertools
import math
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from smgshm.core.node import metrics as node_metrics

PROMTOOL = shutil.which("promtool")


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


Catalogue = dict[str, tuple[str, tuple[str, ...], str]]  # exposed name -> (type, labels with shm_dir, when)


def _node_catalogue() -> Catalogue:
    return {node_metrics.PREFIX + n: (t, ls, w) for n, (t, ls, w, _) in node_metrics.METRICS.items()}


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


def _values(text: str, name: str) -> dict[frozenset[tuple[str, str]], float]:
    fams, _ = parse(text)
    fam = _family_of(name, fams)
    assert fam is not None, f"no {name} in the exposition"
    return {frozenset((k, v) for k, v in ls.items() if k != "shm_dir"): v for n, ls, v in fam.samples if n == name}
