"""fan_out: work on threads whose wait a signal still stops, wherever the kernel delivers it."""

from __future__ import annotations

import os
import signal
import threading
import time
from types import FrameType

import pytest

from smgshm.core.fanout import fan_out


def test_results_come_in_order() -> None:
    assert fan_out(lambda i: i * i, range(20), 4) == [i * i for i in range(20)]
    assert fan_out(lambda i: i, [], 4) == []


class _StopError(Exception):
    pass


def test_a_signal_delivered_to_another_thread_stops_the_wait_at_once() -> None:
    """The main thread blocks the signal, so the kernel must deliver it to a worker (as it may to gRPC's
    threads); its handler still runs in the main thread, within a poll, while the worker is still blocked.
    With ``pool.map`` the main thread slept in a lock until the worker ended (doctor's probe: --timeout)."""
    release, finished = threading.Event(), threading.Event()

    def handler(_signum: int, _frame: FrameType | None) -> None:
        raise _StopError

    def work(i: int) -> int:
        if i == 0:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})  # this thread may take it
            time.sleep(0.5)  # the main thread waiting by then, as it is when an operator presses Ctrl-C
            os.kill(os.getpid(), signal.SIGUSR1)
            release.wait(30)  # a peer that never answers, bounded by its own timeout
            finished.set()
        return i

    old = signal.signal(signal.SIGUSR1, handler)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        with pytest.raises(_StopError):
            fan_out(work, [0, 1], 2)
        assert not finished.is_set(), "the wait outlasted the blocked worker"
    finally:
        release.set()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
        signal.signal(signal.SIGUSR1, old)
