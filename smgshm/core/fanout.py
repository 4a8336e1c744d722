"""Work fanned out to threads, waited for so that a signal still stops the run.

CPython runs a signal's Python handler in the main thread only, at its next bytecode; a main thread
blocked in a lock with no timeout (``Future.result()``, ``Executor.map``'s iterator, ``join()``) wakes
only if the kernel delivers the signal to that very thread. It may deliver it to any thread that does
not block it, gRPC's and a pool's included: then Ctrl-C or SIGTERM during doctor's probe of a worker
that never answers waited out the whole --timeout (measured: 12 of 60 runs under load). So the main
thread never waits without a timeout here: it polls, and a pending signal's handler runs within a poll.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

POLL_S = 0.2  # how soon a signal delivered to another thread is acted on

_T = TypeVar("_T")
_R = TypeVar("_R")


def result(future: Future[_R]) -> _R:
    """``future.result()``, waited for in polls (see the module)."""
    while True:
        done, _ = wait([future], timeout=POLL_S)
        if done:
            return future.result()


def fan_out(fn: Callable[[_T], _R], items: Iterable[_T], max_workers: int, name: str = "smgshm") -> list[_R]:
    """``fn`` over ``items`` on a pool of at most ``max_workers`` threads, the results in order, waited for in
    polls. On any exception (Ctrl-C too) it propagates at once: what has not started is cancelled, and a
    worker still blocked in a peer's call is never joined (each is bounded by its own timeouts and ends on
    its own; the CLI leaves without waiting for it, cli/__init__.py's main)."""
    work = list(items)
    if not work:
        return []
    pool = ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(work))), thread_name_prefix=name)
    futures = [pool.submit(fn, item) for item in work]
    try:
        out = [result(f) for f in futures]
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=False)  # every future is done: its threads are idle and leave
    return out


__all__ = ["POLL_S", "fan_out", "result"]
