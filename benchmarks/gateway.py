"""What SHM is worth in SMG itself: image sizes through the real gateway, inline against shm.

    .venv/bin/python benchmarks/gateway.py [-n 5] [--sizes 224,448,896,1344,1792,2688]

Two real gateways (smg launch, inline and shm, --log-mm-timing), each with a reference receiver,
take the same PNG in alternation in one run. Per size it prints medians only: the latency of each,
the ratio, the gateway's own SHM write (its mm_shm_write log lines), the worker's read (its
receipts), and the pixels at this host's fresh-page floor. These machines are noisy: compare ratios.
"""

from __future__ import annotations

import argparse

from smgshm.core.e2e.sweep import DEFAULT_SIZES, run_sweep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", type=int, default=5, help="measured requests per size and transport")
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="comma list of image sizes (px)")
    args = ap.parse_args()
    rep = run_sweep(tuple(int(s) for s in args.sizes.split(",")), requests=args.n)
    out = [f"fresh tmpfs pages (the floor)  {rep.fresh_page_gb_per_s:.2f} GB/s; memcpy {rep.memcpy_gb_per_s:.2f} GB/s"]
    out.append(
        f"{'px':>5} {'pixels MB':>9} {'inline ms':>9} {'shm ms':>8} {'inl/shm':>7} {'write ms':>8} "
        f"{'floor ms':>8} {'floor/w':>7} {'read ms':>7} {'prep ms':>7}"
    )

    def f(v: float | None, w: int = 8) -> str:
        return f"{'n/a':>{w}}" if v is None else f"{v:>{w}.1f}"

    for r in rep.rows:
        out.append(
            f"{r.image_px:>5} {r.pixel_nbytes / 1e6:>9.1f} {r.inline_p50_ms:>9.1f} {r.shm_p50_ms:>8.1f} "
            f"{(r.speedup or 0):>6.2f}x {f(r.shm_write_ms)} {f(r.floor_ms)} "
            f"{(r.write_floor_fraction or 0):>7.2f} {f(r.worker_read_ms, 7)} {f(r.preprocess_ms, 7)}"
        )
        if r.failed:
            out.append(f"      {r.failed} request(s) failed at {r.image_px} px")
    print("\n".join(out))


if __name__ == "__main__":
    main()
