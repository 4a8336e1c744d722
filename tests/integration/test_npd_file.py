"""NPD without Python in NPD's container: the exporter (``watch --node --npd-file``) writes gc --node --check
--npd's verdict after each full scan (core/node/npdfile.py), and deploy/npd/smgshm-npd.sh, run by ``dash`` and
busybox ``sh`` as NPD's Debian image would run it, says it under NPD's custom plugin contract: exactly one
line of at most 80 printable ASCII characters on stdout, exit 0 OK, 1 problem, 2 Unknown, and Unknown for a
file that is missing, malformed, hostile, huge or stale. The exporter's half runs over a node laid out under
a private root (tests/support/node.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.node import npdfile
from smgshm.core.node.npd import NpdStatus, NpdVerdict
from tests.conftest import Children, run_cli, smgshm_argv, wait_for
from tests.support.node import POD_A, POD_B, dshm, laid_out, needs_root_and_unshare

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PLUGIN = DEPLOY / "npd" / "smgshm-npd.sh"
MONITOR = DEPLOY / "npd" / "smgshm-plugin-monitor.json"


def _shells() -> list[Any]:
    """NPD's image runs /bin/sh, which is dash on Debian; busybox sh is the small POSIX shell beside it."""
    out = []
    for name, argv in (("dash", ["dash"]), ("busybox", ["busybox", "sh"])):
        why = f"{argv[0]} is not installed here"
        out.append(pytest.param(argv, id=name, marks=pytest.mark.skipif(shutil.which(argv[0]) is None, reason=why)))
    return out


SHELLS = _shells()


def plugin(shell: list[str], *args: str) -> tuple[int, str]:
    """The plugin run as NPD runs it; NPD's contract checked on every run: one line, at most 80 printable
    ASCII characters, exit 0, 1 or 2."""
    r = subprocess.run([*shell, str(PLUGIN), *args], capture_output=True, timeout=30, check=False)
    out = r.stdout.decode("ascii")  # raises on anything but ASCII
    assert out.endswith("\n"), (args, out, r.stderr)
    assert out.count("\n") == 1, (args, out, r.stderr)
    line = out[:-1]
    assert 0 < len(line) <= 80, (args, line)
    assert line.isprintable(), (args, line)
    assert r.returncode in (0, 1, 2), (args, r.returncode, out, r.stderr)
    return r.returncode, line


def _boot() -> tuple[str, int]:
    return npdfile.boot_id(), int(time.clock_gettime(time.CLOCK_BOOTTIME))


def _write(path: Path, status: int, line: str, *, age_s: int = 0, boot: str | None = None) -> Path:
    me, now = _boot()
    path.write_text(f"smgshm-npd/1 {boot or me} {now - age_s} {status}\n{line}\n")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("shell", SHELLS)
def test_the_plugin_says_a_fresh_verdict_and_its_status(shell: list[str], tmp_path: Path) -> None:
    me, now = _boot()
    for status in NpdStatus:
        f = tmp_path / "gc"
        line = f"gc: {status.name.lower()} \\n\\x1b (node, 2 tmpfs)"  # escapes the exporter wrote: said as they are
        f.write_text(npdfile.render(NpdVerdict.of(status, line), me, now))
        assert plugin(shell, str(f), "150") == (int(status), NpdVerdict.of(status, line).line)
    f = _write(tmp_path / "gc", 1, "x" * 80)
    assert plugin(shell, str(f), "150") == (1, "x" * 80), "80 characters is NPD's max_output_length: said whole"


@pytest.mark.slow
@pytest.mark.parametrize("shell", SHELLS)
def test_the_plugin_says_unknown_for_a_missing_stale_or_foreign_file(shell: list[str], tmp_path: Path) -> None:
    f = tmp_path / "gc"
    code, line = plugin(shell, str(f), "150")
    assert (code, line) == (2, "smgshm: no verdict file: is the smgshm exporter running with --npd-file?")
    _write(f, 0, "gc: ok", age_s=400)
    code, line = plugin(shell, str(f), "150")
    assert code == 2
    assert "old (bound 150s)" in line, line
    assert plugin(shell, str(f), "500")[0] == 0, "the bound is the argument's"
    _write(f, 0, "gc: ok", boot="00000000-0000-4000-8000-000000000000")
    another = "smgshm: verdict file from another boot: is the smgshm exporter running?"
    assert plugin(shell, str(f), "150") == (2, another)
    _write(f, 0, "gc: ok", age_s=-3600)  # from the future: no clock of this boot made it
    assert plugin(shell, str(f), "150")[0] == 2
    _write(f, 0, "gc: ok", boot="-")  # the exporter could not read the boot id: never fresh
    assert plugin(shell, str(f), "150")[0] == 2
    os.symlink(_write(tmp_path / "real", 0, "gc: ok"), tmp_path / "link")
    assert plugin(shell, str(tmp_path / "real"), "150")[0] == 0
    assert plugin(shell, str(tmp_path / "link"), "150")[0] == 2, "a symlink is no file the exporter wrote"
    assert plugin(shell, str(tmp_path), "150")[0] == 2, "a dir"
    for bad_bound in ("", "-1", "1e3", "99999999999", "$(id)"):
        assert plugin(shell, str(tmp_path / "real"), bad_bound)[0] == 2, bad_bound


@pytest.mark.slow
@pytest.mark.parametrize("shell", SHELLS)
def test_the_plugin_treats_the_file_as_data_never_code(shell: list[str], tmp_path: Path) -> None:
    me, now = _boot()
    pwned = Path(f"/tmp/smgshm-pwned-{os.getpid()}")  # short: a line naming it fits in 80
    assert not pwned.exists()
    f = tmp_path / "gc"
    head = f"smgshm-npd/1 {me} {now}"
    malformed = {
        "garbage": os.urandom(4096),
        "empty": b"",
        "no line": f"{head} 0\n".encode(),
        "an empty line": f"{head} 0\n\n".encode(),
        "a control character": f"{head} 1\ngc: \x1b[31mred\x1b[0m\n".encode(),
        "a carriage return": f"{head} 0\ngc: ok\r\n".encode(),
        "a DEL": f"{head} 0\ngc: ok\x7f\n".encode(),
        "UTF-8": f"{head} 0\ngc: ok \u00e9\n".encode(),
        "81 characters": f"{head} 0\n{'x' * 81}\n".encode(),
        "a status not NPD's": f"{head} 3\ngc: ok\n".encode(),
        "a negative status": f"{head} -1\ngc: ok\n".encode(),
        "a third line": f"{head} 0\ngc: ok\nmore\n".encode(),
        "a field more": f"{head} 0 x\ngc: ok\n".encode(),
        "another format": f"smgshm-npd/2 {me} {now} 0\ngc: ok\n".encode(),
        "an octal time": f"smgshm-npd/1 {me} 0{now} 0\ngc: ok\n".encode(),
        "a time too long": f"smgshm-npd/1 {me} {'9' * 40} 0\ngc: ok\n".encode(),
        "a command in the time": f"smgshm-npd/1 {me} $(touch {pwned}) 0\ngc: ok\n".encode(),
        "arithmetic in the time": f"smgshm-npd/1 {me} x[$(touch {pwned})] 0\ngc: ok\n".encode(),
        "a command in the status": f"{head} `touch {pwned}`\ngc: ok\n".encode(),
    }
    for what, data in malformed.items():
        f.write_bytes(data)
        assert plugin(shell, str(f), "150") == (2, "smgshm: verdict file malformed"), what
    # A line that reads as shell is printable ASCII: said as it is (printf, never echo or eval), never run.
    for line in (f"$(touch {pwned})", f"`touch {pwned}`", "%s%n%d \\c \\0101"):
        f.write_text(f"{head} 1\n{line}\n")
        assert plugin(shell, str(f), "150") == (1, line)
    assert not pwned.exists()
    # Huge: a 1 GiB sparse file and a well-formed start with a long tail; the plugin reads 512 bytes of it.
    with f.open("wb") as out:
        out.write(f"{head} 0\ngc: ok\n".encode())
        out.truncate(1 << 30)
    t0 = time.monotonic()
    assert plugin(shell, str(f), "150") == (2, "smgshm: verdict file malformed")
    assert time.monotonic() - t0 < 20, "bounded: it never reads the whole file"
    f.write_bytes(b"y" * (8 << 20))  # one 8 MiB line, no newline
    assert plugin(shell, str(f), "150") == (2, "smgshm: verdict file malformed")


def test_the_monitor_runs_the_plugin_by_sh_within_npds_contract() -> None:
    cfg = json.loads(MONITOR.read_text())
    assert cfg["plugin"] == "custom"
    assert cfg["pluginConfig"]["max_output_length"] == 80
    (cond,) = cfg["conditions"]
    (rule,) = cfg["rules"]
    assert rule["type"] == "permanent"
    assert rule["condition"] == cond["type"]
    assert rule["path"] == "/bin/sh", "Debian's sh (dash) in NPD's image; the ConfigMap's file needs no exec bit"
    script, verdict, bound = rule["args"]
    assert Path(script).name == PLUGIN.name
    assert int(bound) >= 3 * 30, "several of the exporter's full scans (--rescan-every 30s) before Unknown"
    patch = (DEPLOY / "npd" / "npd-daemonset-patch.yaml").read_text()
    for mount in (os.path.dirname(script), os.path.dirname(verdict)):
        assert f"mountPath: {mount}\n" in patch, mount
    assert f"--config.custom-plugin-monitor={os.path.dirname(script)}/{MONITOR.name}" in patch


def test_npd_file_needs_the_node_view_and_a_writable_dir(tmp_path: Path) -> None:
    run_cli("watch", "--npd-file", str(tmp_path / "gc"), "--count", "1", exit=2)
    where = str(tmp_path / "no" / "gc")
    bad = run_cli("watch", "--node", "--node-root", str(tmp_path), "--npd-file", where, "--count", "1", exit=5)
    assert "cannot write the NPD verdict file" in bad.stderr


@pytest.mark.slow
@pytest.mark.parametrize("shell", SHELLS)
def test_a_blind_view_is_written_as_gc_says_it_and_the_plugin_says_unknown(shell: list[str], tmp_path: Path) -> None:
    root, f = tmp_path / "empty-root", tmp_path / "gc"
    root.mkdir()
    run_cli("watch", "--node", "--node-root", str(root), "--npd-file", str(f), "--count", "1")
    gc = run_cli("gc", "--node", "--node-root", str(root), "--check", "--npd", exit=2).stdout
    assert f.stat().st_mode & 0o777 == 0o644
    assert plugin(shell, str(f), "150") == (2, gc.rstrip("\n"))
    assert "node view unknown" in gc
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty-root", "gc"], "no temporary file left"


@needs_root_and_unshare
@pytest.mark.trust
@pytest.mark.slow
def test_the_exporter_writes_gcs_verdict_after_each_full_scan_and_deletes_nothing(
    tmp_path: Path, children: Children
) -> None:
    root, f = tmp_path / "node", tmp_path / "npd" / "gc"
    f.parent.mkdir()
    with laid_out(root, [(POD_A, "16m", "dead"), (POD_B, "16m", "live")]):
        leaked = sorted(p.name for p in dshm(root, POD_A[2]).iterdir() if p.name.startswith("smg-"))
        assert len(leaked) == 1
        argv = smgshm_argv("-q", "watch", "--node", "--node-root", str(root), "--npd-file", str(f))
        p = children.spawn([*argv, "--rescan-every", "1s", "--interval", "0.2"])
        first = wait_for(lambda: f.exists() and f.read_text(), 60, "the first verdict")
        gc = run_cli("gc", "--node", "--node-root", str(root), "--check", "--npd", exit=1).stdout.rstrip("\n")
        assert gc.startswith("gc: 1 leaked"), gc
        assert first.splitlines()[1] == gc, "the same line gc --node --check --npd says"
        assert first.split()[3] == "1"
        assert f.stat().st_mode & 0o777 == 0o644
        for shell in (s.values[0] for s in SHELLS if shutil.which(s.values[0][0])):
            assert plugin(shell, str(f), "150") == (1, gc)
        stamp = first.split()[2]
        wait_for(lambda: f.read_text().split()[2] != stamp, 60, "a later full scan's verdict")
        assert p.poll() is None
        assert os.listdir(f.parent) == ["gc"], "written through a temporary file renamed over it, none left"
        # A check, never a reap: the leak is still there after many full scans, as gc's own check leaves it.
        assert sorted(p.name for p in dshm(root, POD_A[2]).iterdir() if p.name.startswith("smg-")) == leaked
        p.terminate()
        p.wait(timeout=30)


# The shape of NPD's upstream DaemonSet (deployment/node-problem-detector.yaml): one container, its flags in
# `command`, its own config at /config.
NPD_DAEMONSET = """
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: node-problem-detector, namespace: kube-system}
spec:
  selector: {matchLabels: {app: node-problem-detector}}
  template:
    metadata: {labels: {app: node-problem-detector}}
    spec:
      containers:
        - name: node-problem-detector
          image: registry.k8s.io/node-problem-detector/node-problem-detector:v0.8.20
          command: [/node-problem-detector, --logtostderr, --config.system-log-monitor=/config/kernel-monitor.json]
          volumeMounts: [{name: config, mountPath: /config, readOnly: true}]
      volumes: [{name: config, configMap: {name: node-problem-detector-config}}]
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed here")
def test_the_patch_wires_npds_daemonset_to_the_configmap_and_the_exporters_dir(tmp_path: Path) -> None:
    import yaml

    ds = tmp_path / "npd.yaml"
    ds.write_text(NPD_DAEMONSET)
    patch = DEPLOY / "npd" / "npd-daemonset-patch.yaml"
    argv = ["kubectl", "patch", "--local", "-f", str(ds), "--type", "json", "--patch-file", str(patch), "-o", "yaml"]
    spec = yaml.safe_load(subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout)
    spec = spec["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in spec["volumes"]}
    rule = json.loads(MONITOR.read_text())["rules"][0]
    script, verdict, _ = rule["args"]
    cm = yaml.safe_load((DEPLOY / "k8s" / "npd-configmap.yaml").read_text())
    plugin_mount = mounts[os.path.dirname(script)]
    assert vols[plugin_mount["name"]]["configMap"]["name"] == cm["metadata"]["name"]
    assert Path(script).name in cm["data"]
    verdict_mount = mounts[os.path.dirname(verdict)]
    assert verdict_mount["readOnly"] is True, "NPD only reads the verdict"
    exporter = next(
        d
        for d in yaml.safe_load_all((DEPLOY / "k8s" / "exporter-daemonset.yaml").read_text())
        if d["kind"] == "DaemonSet"
    )
    ex_spec = exporter["spec"]["template"]["spec"]
    ex_host = {v["name"]: v["hostPath"]["path"] for v in ex_spec["volumes"] if "hostPath" in v}
    ex_args = ex_spec["containers"][0]["args"]
    written = ex_args[ex_args.index("--npd-file") + 1]
    (ex_mount,) = [m for m in ex_spec["containers"][0]["volumeMounts"] if m["mountPath"] == os.path.dirname(written)]
    host_dir = vols[verdict_mount["name"]]["hostPath"]["path"]
    assert ex_host[ex_mount["name"]] == host_dir, "NPD reads the host dir the exporter writes"
    assert Path(written).name == Path(verdict).name
    assert f"--config.custom-plugin-monitor={os.path.dirname(script)}/{MONITOR.name}" in c["command"]
    assert "--config.system-log-monitor=/config/kernel-monitor.json" in c["command"], "NPD's own flags kept"
