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
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, TypeVar

T = TypeVar("T")

READ_S = 2.0  # one read: far above any answering filesystem's, far below a scrape's or an NPD run's timeout
MAX_STUCK = 8  # workers left behind at once, in the whole process


class StuckReadError(TimeoutError):
    """A read that did not answer within its bound (``what``: which one, as a phrase)."""

    def __init__(self, what: str, waited_s: float, why: str = "") -> None:
        self.what, self.waited_s, self.why = what, waited_s, why
        # Of a hand-off of several reads: the answers before the read it names, and that read's index; None when
        # it holds for every read of the hand-off (none was made: the run's time spent, too many stuck).
        self.answers: list[tuple[bool, Any]] = []
        self.at: int | None = None
        said = why or f"did not answer within {waited_s:g} s"
        super().__init__(errno.ETIMEDOUT, f"{what} {said} (a stalled FUSE or network filesystem, or a process stuck)")


class _Worker:
    def __init__(self) -> None:
        self.what = ""  # the read it was left to
        self.abandoned = False  # left to a read that did not answer: it ends once that read does
        # A job: the call, the box its answers go to, and a lock its caller holds, which the worker releases when
        # done (a Lock, not an Event: released by another thread all the same, and a tenth of the cost a hand-off).
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], list[Any], threading.Lock]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="smgshm-bounded-read", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            fn, box, done = self.jobs.get()
            try:
                fn()
            except BaseException as err:  # handed back to the caller, who raises it
                box.append((False, err))
            done.release()
            with _lock:
                if self.abandoned:
                    _stuck.discard(self)
                    return


_lock = threading.Lock()
_stuck: set[_Worker] = set()  # workers left to a read that did not answer
_local = threading.local()  # this thread's worker and run deadline
_reading = threading.local()  # in a worker: the clock of the read under way (``step``)


def step() -> None:
    """Called by a read that is several in turn (a chain of opens, a pod's volumes) as the next begins: each is
    bounded on its own, as separate reads are, not their sum. Outside a worker's read: nothing."""
    started = getattr(_reading, "started", None)
    if started is not None:
        started[0] = time.monotonic()


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


def _hand_off(whats: list[str], job: Callable[[list[Any], list[float]], None]) -> list[tuple[bool, Any]]:
    """Run ``job(box, started)`` on this thread's worker: it appends to ``box`` an answer per read of ``whats``, in
    turn, and sets ``started[0]`` (monotonic) as it begins each, or stops once ``started[1]`` is set (its caller
    left it). Each read is waited for at most ``READ_S`` (and not past the run's deadline): one that does not
    answer in time raises ``StuckReadError`` naming it."""
    deadline = getattr(_local, "deadline", None)
    now = time.monotonic()
    if deadline is not None and deadline <= now:
        raise StuckReadError(whats[0], 0, "was not read: the run's time for reads was spent")
    with _lock:
        for w in _stuck:  # a scrape after a scrape: it would stick again
            if w.what in whats:
                err = StuckReadError(w.what, 0, "was not read: an earlier read of it is stuck still")
                err.at = whats.index(w.what)
                raise err
        worker: _Worker | None = getattr(_local, "worker", None)
        if worker is None and len(_stuck) >= MAX_STUCK:
            raise StuckReadError(whats[0], 0, f"was not read: {len(_stuck)} earlier reads are stuck still")
    if worker is None:
        worker = _local.worker = _Worker()
    box: list[tuple[bool, Any]] = []
    started = [now, 0.0]
    done = threading.Lock()
    done.acquire()
    worker.jobs.put((lambda: job(box, started), box, done))
    while True:
        until = started[0] + READ_S if deadline is None else min(started[0] + READ_S, deadline)
        if done.acquire(timeout=max(0.0, until - time.monotonic())):
            return box
        with _lock:
            now = time.monotonic()
            if done.acquire(blocking=False):  # it answered just now: the worker carries on
                return box
            if len(box) >= len(whats):  # every read answered; the worker is only yet to say so
                break
            if now < started[0] + READ_S and (deadline is None or now < deadline):
                continue  # the read it waited for answered, and the next began since
            at = min(len(box), len(whats) - 1)
            what = whats[at]
            worker.abandoned, worker.what = True, what
            started[1] = 1.0  # the reads after it are not made: the worker ends once this one answers
            _stuck.add(worker)
            _local.worker = None
            err = StuckReadError(what, until - started[0])
            err.answers, err.at = box[:at], at
            raise err
    done.acquire()  # released at once: the job has returned (its last answer given)
    return box


def bounded(what: str, fn: Callable[..., T], *args: Any, late: Callable[[T], object] | None = None) -> T:
    """``fn(*args)`` done by this thread's worker, waited for at most ``READ_S`` (and not past the run's
    deadline); its exception raised here. ``what`` names the read in the error: ``/proc/12/fd/3``.
    ``late(answer)``: what becomes of an answer that comes after its caller left (an fd opened: closed),
    never handed to anyone else."""

    def job(box: list[Any], started: list[float]) -> None:
        _reading.started = started
        value = fn(*args)
        with _lock:  # the caller leaves under it: so an answer is either taken, or left and let go here
            if not started[1]:
                box.append((True, value))
                return
        if late is not None:
            late(value)

    ((ok, value),) = _hand_off([what], job)
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def bounded_calls(calls: Sequence[tuple[str, Callable[[], Any]]]) -> list[Any]:
    """Each ``(what, fn)`` of ``calls`` run in turn in ONE hand-off to this thread's worker (one process's reads:
    one hand-off, not one a read), each read bounded as ``bounded``'s is; the answer of each, or its OSError.
    StuckReadError names the read that did not answer (those after it are not made)."""
    if not calls:
        return []
    out = _hand_off([what for what, _fn in calls], _reads_job([(0, what, fn) for what, fn in calls]))
    for ok, value in out:
        if not ok:
            raise value  # not an OSError: a bug's, raised as it was
    return [value for _ok, value in out]


Group = Sequence[tuple[str, Callable[[], Any]]]
_Read = tuple[int, str, Callable[[], Any]]  # (its group, what it reads, the read)


def _reads_job(reads: list[_Read]) -> Callable[[list[Any], list[float]], None]:
    """The worker's job for ``reads``, made in turn until its caller leaves: each answer (or OSError) into the
    box; one that comes after its caller left is let go (so no read of a group may give what must be closed)."""

    def job(box: list[Any], started: list[float]) -> None:
        _reading.started = started
        started[0] = time.monotonic()
        for _i, _what, fn in reads:
            if started[1]:
                return
            try:
                value = fn()
            except OSError as err:
                value = err
            with _lock:  # the caller leaves under it: an answer is taken, and the next read's clock set, at once
                if started[1]:
                    return
                box.append((True, value))
                started[0] = time.monotonic()

    return job


def bounded_groups(groups: Sequence[Group]) -> list[list[Any] | OSError]:
    """``bounded_calls`` of each of ``groups`` (one process's reads, say), many groups in ONE hand-off (a walk
    of /proc: one hand-off for its processes, not one each: each is a round trip of threads). Each group's
    answers (each read's, or its OSError), or the ``StuckReadError`` of its read that did not answer in time:
    that group's later reads are not made, and the groups after it go on in a fresh hand-off, each read still
    bounded as ``bounded``'s is. No read may give what must be closed (an fd): one answering after its caller
    left is let go."""
    out: list[list[Any] | OSError] = [[] for _ in groups]
    pending = [i for i, g in enumerate(groups) if g]
    while pending:
        reads = [(i, what, fn) for i in pending for what, fn in groups[i]]
        try:
            answers, failed, refused = _hand_off([what for _i, what, _fn in reads], _reads_job(reads)), None, None
        except StuckReadError as err:
            answers, failed, refused = err.answers, err, (None if err.at is None else reads[err.at][0])
        got: dict[int, list[Any]] = {i: [] for i in pending}
        for (i, _what, _fn), (ok, value) in zip(reads, answers, strict=False):
            if not ok:
                raise value  # not an OSError: a bug's, raised as it was
            got[i].append(value)
        left = []
        for i in pending:
            if len(got[i]) == len(groups[i]):
                out[i] = got[i]
            elif failed is not None and refused == i:
                out[i] = failed  # the group of the read that stuck
            elif failed is not None and refused is None:  # none could be read (the run's time spent): each says so
                out[i] = StuckReadError(groups[i][0][0], failed.waited_s, failed.why)
            else:
                left.append(i)  # not reached in this hand-off: the next one makes its reads
        pending = left
    return out


def bounded_each(paths: Sequence[str], fn: Callable[[str], T]) -> list[T | OSError]:
    """``fn(path)`` for each of ``paths`` (a process's fds), in one hand-off: ``bounded_calls``."""
    return bounded_calls([(path, partial(fn, path)) for path in paths])


__all__ = [
    "MAX_STUCK",
    "READ_S",
    "Group",
    "StuckReadError",
    "bounded",
    "bounded_calls",
    "bounded_each",
    "bounded_groups",
    "step",
    "stuck_now",
    "within",
]
