"""Coverage-guided fuzzing of the receiver's decoding (atheris), bounded for CI.

The target, tests/fuzz/fuzz_receive.py, asserts its own invariants (receipts or a
WireError, the shm dir untouched); libFuzzer exits non-zero on the first violation,
uncaught exception or RSS over the limit, and writes the input that did it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris", reason="atheris has no wheel for this platform")

TARGET = Path(__file__).resolve().parents[1] / "fuzz" / "fuzz_receive.py"
RUNS = 150_000  # ~15-25 s here; -max_total_time bounds it on a slower machine


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_fuzzed_multimodal_inputs_never_crash_the_receiver(tmp_path: Path) -> None:
    corpus, shm = tmp_path / "corpus", tmp_path / "shm"
    corpus.mkdir()
    shm.mkdir()
    out = subprocess.run(
        [
            sys.executable,
            str(TARGET),
            str(corpus),
            f"-runs={RUNS}",
            "-max_total_time=60",
            "-rss_limit_mb=2048",
            "-max_len=4096",
            f"-artifact_prefix={tmp_path}/",
        ],
        cwd=tmp_path,
        env={**os.environ, "SMGSHM_FUZZ_SHM_DIR": str(shm)},
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Done" in out.stderr
    assert not list(tmp_path.glob("crash-*")) + list(tmp_path.glob("oom-*")) + list(tmp_path.glob("leak-*"))
    # The seeds were written and the fuzzer found inputs beyond them: it really explored.
    names = os.listdir(corpus)
    assert sum(n.startswith("seed-") for n in names) == 12
    assert len(names) > 12
    assert sorted(os.listdir(shm)) == ["smg-smgshm-1-1-0", "smg-smgshm-3-3-0", "smg-tokenspeed-2-2-0"]
