"""Inline vs SHM on this host, side by side in one run: the ratios the bench issue sets as its bar.

    .venv/bin/python benchmarks/transport.py [-n 7]

Prints medians and ratios only; these machines are noisy (±15-30 %), so compare ratios.
"""

from __future__ import annotations

import argparse

from smgshm.core.client.bench import BenchOptions, BenchReport, run_bench
from smgshm.core.client.whatif import WhatIfSkippedError, run_what_if
from smgshm.core.receiver.reader import ReceiverConfig
from smgshm.core.receiver.services import start_receiver

MIB = 1024 * 1024


def _run(reader: str, n: int) -> BenchReport:
    r = start_receiver(ReceiverConfig(reader=reader), "127.0.0.1:0")  # type: ignore[arg-type]
    try:
        return run_bench(r.address, BenchOptions((1 * MIB, 16 * MIB, 64 * MIB), warmup=2, iterations=n), reader)
    finally:
        r.stop(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", type=int, default=7, help="iterations per size and transport")
    n = ap.parse_args().n
    view, copy = _run("view", n), _run("copy", n)
    by = {s.nbytes: s for s in view.sizes}
    h = view.host
    out = [
        f"memcpy (single thread)           {h.memcpy_gb_per_s:6.2f} GB/s",
        f"fresh tmpfs pages (the floor)    {h.fresh_page_gb_per_s:6.2f} GB/s",
        f"writer pwrite                    {h.writer_pwrite_gb_per_s:6.2f} GB/s",
        f"writer fallocate+mmap (SMG's)    {h.writer_mmap_gb_per_s:6.2f} GB/s",
        f"pwrite / mmap writer             {h.writer_pwrite_gb_per_s / h.writer_mmap_gb_per_s:6.2f}x",
    ]
    for size in (1 * MIB, 16 * MIB, 64 * MIB):
        s = by[size]
        inl = s.inline.p50_ms if s.inline else float("nan")
        out.append(
            f"{size // MIB:>3} MiB  inline {inl:8.2f} ms  shm {s.shm.p50_ms:7.2f} ms  "
            f"shm/inline speedup {s.speedup or 0:5.2f}x  shm {s.shm.gb_per_s:.2f} GB/s"
        )
    big = by[64 * MIB]
    cbig = {s.nbytes: s for s in copy.sizes}[64 * MIB]
    out += [
        f"64 MiB shm end to end / fresh-page floor   {big.shm.gb_per_s / h.fresh_page_gb_per_s:5.2f}",
        f"64 MiB zero-copy read / copy read          {big.shm_read_ms / cbig.shm_read_ms:5.3f} "
        f"({big.shm_read_ms:.2f} ms vs {cbig.shm_read_ms:.2f} ms)",
        f"recommendation: {view.recommendation}",
    ]
    s16 = by[16 * MIB].speedup or 0.0
    bar = {
        "shm >= 5x inline at 16 MiB": s16 >= 5,
        "shm >= 8x inline at 64 MiB": (big.speedup or 0.0) >= 8,
        "shm at 64 MiB >= 0.5 of the fresh-page floor": big.shm.gb_per_s / h.fresh_page_gb_per_s >= 0.5,
        "zero-copy read <= 10 % of the copy read": big.shm_read_ms <= 0.1 * cbig.shm_read_ms,
        "smgshm's writer (pwrite) is the faster": h.writer_pwrite_gb_per_s >= h.writer_mmap_gb_per_s,
    }
    out += [f"bar  {'met   ' if ok else 'MISSED'} {what}" for what, ok in bar.items()]
    out += _what_if_rows(n)
    print("\n".join(out))


def _what_if_rows(n: int) -> list[str]:
    """The same SHM path on a private huge=within_size tmpfs beside the shm dir (root only)."""
    try:
        r = run_what_if((4_816_896, 64 * MIB), iterations=n)
    except WhatIfSkippedError as err:
        return [f"huge-page what-if: {err.what}"]
    out = [
        f"huge-page what-if ({'huge pages used' if r.huge_pages_used else 'NO huge pages given'}; "
        f"4 KiB -> huge=within_size, GB/s, ratio of times)"
    ]
    for s in r.sizes:
        label = f"{s.nbytes / MIB:5.1f} MiB"
        for p in s.pairs:
            out.append(f"{label}  {p.label:<28} {p.normal_gb_per_s:7.2f} -> {p.huge_gb_per_s:7.2f}  {p.speedup:6.2f}x")
    return out


if __name__ == "__main__":
    main()
