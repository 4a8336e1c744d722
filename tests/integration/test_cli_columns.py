"""Every command's human output on a real terminal of 80 columns (a pty sized with TIOCSWINSZ, no
COLUMNS in the environment): no line wider than the terminal, none ending in a space, no number cut
across two lines (``conftest.assert_fits``), on stdout and on stderr."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.conftest import Children, PtyResult, assert_fits, make_file, run_cli, run_pty, smgshm_argv
from tests.support.e2e import needs_smg

pytestmark = pytest.mark.timeout(300)


def fits(res: PtyResult, code: int = 0) -> str:
    assert res.exit_code == code, f"exit {res.exit_code} != {code}\n{res.stdout}\n--- stderr\n{res.stderr}"
    assert_fits(res.stdout, what="stdout")
    assert_fits(res.stderr, what="stderr")
    return res.stdout


def pty(*args: str, code: int = 0, **kw: object) -> str:
    return fits(run_pty(smgshm_argv(*args), **kw), code)  # type: ignore[arg-type]


def dead_pid(children: Children) -> int:
    p = children.spawn([smgshm_argv()[0], "-c", ""])
    p.wait(timeout=30)
    return p.pid


def smg_names(pid: int, n: int) -> list[str]:
    """Names as SMG's gateway writes them: smg-tokenspeed-<pid>-<nanos>-<seq> (46 or so characters)."""
    return [f"smg-tokenspeed-{pid}-{1796331038054686158 + i}-{i}" for i in range(n)]


@pytest.mark.slow
def test_the_terminal_is_what_sets_the_width(tmp_path: Path) -> None:
    """The helper's own proof: the same listing on a wider terminal keeps a row that 80 splits."""
    make_file(str(tmp_path), smg_names(4_000_000, 1)[0])
    narrow = pty("gc", "--shm-dir", str(tmp_path), "--assume-dead")
    wide = run_pty(smgshm_argv("gc", "--shm-dir", str(tmp_path), "--assume-dead"), cols=160).stdout
    assert any(ln.endswith(smg_names(4_000_000, 1)[0]) and ln.startswith("leaked") for ln in wide.splitlines())
    assert not any(ln.startswith("leaked") and "smg-tokenspeed" in ln for ln in narrow.splitlines())


def test_ns_and_ns_compare() -> None:
    out = pty("ns")
    assert re.search(r"^size\s+\d+\.\d \w*B, ", out, re.M), out  # one units style: '23.5 GiB', never '24105 MiB'
    out = pty("ns", "compare", "00000000-0000-4000-8000-000000000000:1", code=3)
    assert "not shared" in out


@pytest.mark.slow
def test_probe_and_send(receiver: object) -> None:
    addr = receiver.address  # type: ignore[attr-defined]
    out = pty("probe", addr)
    assert out.startswith("SHM usable")
    out = pty("send", "--size", "64KiB", "--tensors", "2", "-n", "4", addr)
    assert out.startswith("OK: ")
    assert re.search(r"\d+\.\d+ ms", out), "latencies in the one duration style"


@pytest.mark.slow
def test_gc_summary_and_all_with_real_smg_names(children: Children, tmp_path: Path) -> None:
    d = str(tmp_path)
    names = smg_names(dead_pid(children), 30)
    for i, n in enumerate(names):
        make_file(d, n, size=4096 * (i + 1), age_s=90 + i)
    out = pty("gc", "--shm-dir", d, "--assume-dead")
    assert all(f"\n  {n}\n" in out for n in names[-20:]), "a name that does not fit: whole, on its own line"
    out = pty("gc", "--shm-dir", d, "--assume-dead", "--all")
    for n in names:
        assert out.count(n) == 1, f"--all lists {n} once"
    assert "entries that matter most" not in out
    assert out.count("why: ") == 20, "the reasons of the entries that matter most, under their rows"


@pytest.mark.slow
def test_bench_tiny_sizes() -> None:
    out = pty("bench", "--sizes", "4KiB,64KiB", "--warmup", "0", "-n", "2")
    assert "set --multimodal-shm-min-bytes" in out or "never beat inline" in out


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the what-if mounts a private tmpfs (root)")
def test_bench_what_if(tmp_path: Path) -> None:
    out = pty(
        "bench",
        "--what-if",
        "huge-pages",
        "--sizes",
        "64KiB,1MiB",
        "-n",
        "2",
        env={"XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert "huge-page what-if" in out
    assert "end to end (SMG's path)" in out


@pytest.mark.slow
def test_doctor(tmp_path: Path, shm_dir: str) -> None:
    # Not the gateways nor the segments other tests make on this machine: their state is theirs (a segment of
    # another pid namespace's in /dev/shm is unknown here, and a leaks check of only those judged nothing).
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = pty("doctor", "--no-e2e", "--no-gateways", "--shm-dir", shm_dir, env=env)
    assert out.startswith("doctor: ")
    assert not re.search(r"\d{4,} MiB", out), "never '24105 MiB': one size style"


@needs_smg
def test_e2e_embedded(model_dir: str) -> None:
    res = run_pty(smgshm_argv("e2e", "--mode", "shm", "-n", "4", "--model-dir", model_dir))
    out = fits(res)
    assert out.startswith("e2e: as expected")
    assert "MB" not in out.replace("MiB", ""), "binary units only"
    assert "e2e requests" in res.stderr, "a progress bar on a terminal"
    assert "request 1/" not in res.stderr


@needs_smg
def test_e2e_piped_progress_is_a_few_lines_not_one_per_request(model_dir: str) -> None:
    err = run_cli("e2e", "--mode", "shm", "-n", "12", "--model-dir", model_dir).stderr
    said = re.findall(r"^requests: (\d+)/12 answered, 0 failed$", err, re.M)
    assert said == ["1", "3", "6", "9", "12"], err


@pytest.mark.slow
def test_watch_on_a_terminal(tmp_path: Path) -> None:
    out = pty("watch", "--shm-dir", str(tmp_path), "--duration", "1", "--interval", "0.2")
    assert re.search(r"(^|\r)watched\s", out, re.M), "the summary, after the live dashboard is gone"


@pytest.mark.slow
def test_serve_start_banner() -> None:
    out = pty("serve", "--listen", "127.0.0.1:0", stop_on="smgshm serve: ready", timeout=30)
    assert out.startswith("smgshm serve: ready on 127.0.0.1:")


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="a small tmpfs of its own (root)")
def test_preflight(tmp_path: Path) -> None:
    from tests.conftest import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "small", "4m") as d:
        out = pty("preflight", "--shm-dir", d, "--inflight-bytes", "8MiB")
    assert out.startswith("preflight degraded: the gateway may start; SHM will be off (inline):")
    assert "8.0 MiB" in out
