"""Reads that can block, done with a bound: a stuck one is an error that says what stuck, never a hang.

What can block a walk of /proc: a stat or open through a process's cwd, root or fd link reaches the
file's own filesystem, and a FUSE server that stopped answering (or a hard NFS mount whose server has
gone) keeps the caller waiting without bound, deaf to every signal short of SIGKILL; reading
/proc/P/maps takes P's mmap_lock, which a process stuck in a page fault on such a file holds. Reads of
procfs's own files (status, fdinfo, the ns links, mountinfo) never leave procfs, and are done inline.

So those reads are handed to a worker thread (one per calling thread, reused: a hand-off costs tens of
microseconds) and waited for at most ``READ_S``, and never past the deadline of the run under way
(``within``): a read that does not answer in time raises ``StuckReadError``, a ``TimeoutError`` and so an
``OSError``, which a walk that counts an unreadable process as doubt counts as such. Its worker is left
to the read (it ends when the read does) and a fresh one takes the next; at most ``MAX_STUCK`` are left
at once in the whole process (a long-running exporter included), after which a read that would need a
worker fails at once. So a run waits on stuck reads at most ``READ_S`` times ``MAX_STUCK``, and at most
its own deadline in all.
"""

from __future__ import annotations

import contextlib
import errno
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

READ_S = 2.0  # one read: far above any answering filesystem's, far below a scrape's or an NPD run's timeout
MAX_STUCK = 8  # workers left behind at once, in the whole process


class StuckReadError(TimeoutError):
    """A read that did not answer within its bound (``what``: which one, as a phrase)."""

    def __init__(self, what: str, waited_s: float, why: str = "") -> None:
        self.what, self.waited_s = what, waited_s
        said = why or f"did not answer within {waited_s:g} s"
        super().__init__(errno.ETIMEDOUT, f"{what} {said} (a stalled FUSE or network filesystem, or a process stuck)")


class _Worker:
    def __init__(self) -> None:
        self.what = ""  # the read it was left to
        self.abandoned = False  # left to a read that did not answer: it ends once that read does
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], list[Any], threading.Event]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="smgshm-bounded-read", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            fn, box, done = self.jobs.get()
            try:
                box.append((True, fn()))
            except BaseException as err:  # handed back to the caller, who raises it
                box.append((False, err))
            done.set()
            with _lock:
                if self.abandoned:
                    _stuck.discard(self)
                    return


_lock = threading.Lock()
_stuck: set[_Worker] = set()  # workers left to a read that did not answer
_local = threading.local()  # this thread's worker and run deadline


def _forked() -> None:
    """A forked child has none of its parent's workers (threads do not survive fork): start afresh."""
    global _lock, _local
    _lock, _local = threading.Lock(), threading.local()
    _stuck.clear()


os.register_at_fork(after_in_child=_forked)


def stuck_now() -> int:
    """How many workers are left to reads that have not answered yet."""
    with _lock:
        return len(_stuck)


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """A run's deadline for this thread's bounded reads: past it, each fails at once (an outer run's
    deadline, when sooner, stays)."""
    outer = getattr(_local, "deadline", None)
    mine = time.monotonic() + seconds
    _local.deadline = mine if outer is None else min(outer, mine)
    try:
        yield
    finally:
        _local.deadline = outer


def bounded(what: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` done by this thread's worker, waited for at most ``READ_S`` (and not past the run's
    deadline); its exception raised here. ``what`` names the read in the error: ``/proc/12/fd/3``."""
    deadline = getattr(_local, "deadline", None)
    wait = READ_S if deadline is None else min(READ_S, deadline - time.monotonic())
    if wait <= 0:
        raise StuckReadError(what, 0, "was not read: the run's time for reads was spent")
    with _lock:
        if any(w.what == what for w in _stuck):  # a scrape after a scrape: it would stick again
            raise StuckReadError(what, 0, "was not read: an earlier read of it is stuck still")
        worker: _Worker | None = getattr(_local, "worker", None)
        if worker is None and len(_stuck) >= MAX_STUCK:
            raise StuckReadError(what, 0, f"was not read: {len(_stuck)} earlier reads are stuck still")
    if worker is None:
        worker = _local.worker = _Worker()
    box: list[tuple[bool, Any]] = []
    done = threading.Event()
    worker.jobs.put((lambda: fn(*args), box, done))
    if not done.wait(wait):
        with _lock:
            if not done.is_set():  # else it answered just now: the worker carries on
                worker.abandoned, worker.what = True, what
                _stuck.add(worker)
                _local.worker = None
                raise StuckReadError(what, wait)
    ok, value = box[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


__all__ = ["MAX_STUCK", "READ_S", "StuckReadError", "bounded", "stuck_now", "within"]
