"""gc's set-aside names: whose they are, whether that gc still runs, and the way back for a dead one's.

gc --delete (and a reclaiming preflight) renames each entry of a batch to a private name before it verifies and
unlinks it (segments/reaping.py). A gc killed mid-batch (SIGKILL: a pod's grace period run out, the OOM killer)
cannot put the batch back, so the name says what a later run needs (core/names.py: ``parse_aside``): the gc's pid,
its start time in clock ticks since boot and its pid namespace, and the name the entry stood for. No sidecar file
(one can be lost between two renames) and no xattr (tmpfs keeps ``user.*`` xattrs only from Linux 6.6, and the shm
dir may be any filesystem): the name is the one thing that moves with the entry.

Whether that gc runs (``gc_state``):
- alive: a process with that pid, in that pid namespace, started at that tick (on the initial time namespace's
  boot clock: a time namespace's offset is taken out), and not a zombie. Its batch is under way: the entry is
  never touched;
- dead: in this very pid namespace no process has the pid (``kill(pid, 0)``: ESRCH, which hidepid cannot fake), or
  the one that has it started at another tick (the pid was reused), or it is a zombie. A process never changes
  its pid or start time, so that gc will never finish the batch: the entry may go back under its name;
- from the initial pid namespace, as root, a gc of another pid namespace is judged alike: it runs iff a process
  of that namespace has its pid there and its start time;
- unknown: another pid namespace (seen from one that is not the initial), a /proc that is not this namespace's,
  or what it says cannot be read. Left.

Across a reboot, a tmpfs is empty; a disk-backed dir may keep an entry whose (pid, start) a process of the new
boot happens to match: that reads alive, the safe side (left, never touched).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
from dataclasses import dataclass
from typing import Literal

from smgshm.core.names import ASIDE_PREFIX, AsideName, aside_name, parse_aside

GcState = Literal["alive", "dead", "unknown"]
INIT_PID_NS_INO = 4026531836  # PROC_PID_INIT_INO: the initial pid namespace, which sees every process
RENAME_NOREPLACE = 1  # linux/fs.h


def rename_noreplace(dfd: int, src: str, dst: str) -> None:
    """renameat2(dfd, src, dfd, dst, RENAME_NOREPLACE): atomic, and never over an entry that has ``dst``."""
    import ctypes  # here: only a reaping gc renames (ctypes was 2 ms of every gc's start-up)

    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.renameat2(dfd, os.fsencode(src), dfd, os.fsencode(dst), RENAME_NOREPLACE)
    if rc != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), src)


@dataclass(frozen=True)
class Restored:
    """A dead gc's set-aside: put back under its name (``restored``), or left and why."""

    aside: str
    original: str
    restored: bool
    reason: str


def _stat_fields(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (field 3, the state, first); None: unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()
    except OSError:
        return None


@functools.lru_cache(maxsize=1)
def _boottime_offset_ticks() -> int:
    """This process's time namespace's boot-clock offset, in clock ticks. /proc/P/stat gives a start time on the
    reader's boot clock, which a time namespace shifts: less this offset, every reader sees one start time."""
    try:
        with open("/proc/self/timens_offsets", "rb") as f:
            for line in f:
                clk, secs, nanos = line.split()
                if clk == b"boottime":
                    hz = os.sysconf("SC_CLK_TCK")
                    return int(secs) * hz + int(nanos) * hz // 1_000_000_000
    except (OSError, ValueError):
        pass  # no time namespaces here (CONFIG_TIME_NS off): no offset
    return 0


def _start_ticks(fields: list[bytes] | None) -> int:
    """A process's start time (field 22 of /proc/P/stat) on the initial time namespace's boot clock; 0: unreadable."""
    if not fields or len(fields) <= 19 or not fields[19].isdigit():
        return 0
    return int(fields[19]) - _boottime_offset_ticks()


@functools.lru_cache(maxsize=4)
def _identity(pid: int) -> tuple[int, int]:
    """(start ticks, pid namespace inode) of this process, ``pid`` the cache key (a fork is another process);
    0 for what cannot be read, which no later run can then prove dead."""
    start = max(0, _start_ticks(_stat_fields("self")))
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ns = 0
    return start, ns


def this_gc_aside(original: str) -> str | None:
    """The name this process sets ``original`` aside under; None when it would pass NAME_MAX."""
    pid = os.getpid()
    start, ns = _identity(pid)
    return aside_name(original, pid, start, ns)


def _own_procfs() -> bool:
    """Whether /proc is this pid namespace's (a container may see another's): its ``self`` is this process."""
    try:
        return os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return False


def gc_state(a: AsideName) -> tuple[GcState, str]:
    """Whether the gc that set an entry aside runs, and why, in a clause (see the module)."""
    who = f"gc pid {a.gc_pid}"
    if not a.gc_start or not a.gc_pidns:
        return "unknown", f"{who} did not record its start time or pid namespace: cannot tell whether it runs"
    _start, ns = _identity(os.getpid())
    if not ns or not _own_procfs():
        return "unknown", f"{who}: this /proc is not this pid namespace's: cannot tell whether it runs"
    if a.gc_pidns != ns:
        if ns == INIT_PID_NS_INO and os.geteuid() == 0:
            return _state_elsewhere(a, who)
        return "unknown", f"{who} ran in pid namespace pid:[{a.gc_pidns}], not this one: cannot tell whether it runs"
    try:
        os.kill(a.gc_pid, 0)
    except ProcessLookupError:
        return "dead", f"{who} is dead (no process has its pid)"
    except PermissionError:
        pass  # it exists, another user's
    fields = _stat_fields(a.gc_pid)
    if not _start_ticks(fields):
        # Gone since the kill, or hidden from this user (hidepid): read again by kill, never guessed.
        try:
            os.kill(a.gc_pid, 0)
        except ProcessLookupError:
            return "dead", f"{who} is dead (no process has its pid)"
        except PermissionError:
            pass
        return "unknown", f"{who}: its process cannot be read here (hidepid?): cannot tell whether it is that gc"
    # A tick apart is the same start: the offset, in ticks, rounds (a reused pid is never a tick apart).
    if abs(_start_ticks(fields) - a.gc_start) > 1:
        return "dead", f"{who} is dead (its pid now belongs to a process started at another time)"
    if fields and fields[0] in (b"Z", b"X"):
        return "dead", f"{who} is dead (a zombie: it was killed and awaits its parent)"
    return "alive", f"{who} runs: its batch is under way"


def _state_elsewhere(a: AsideName, who: str) -> tuple[GcState, str]:
    """From the initial pid namespace, as root, every process is seen: the gc of another pid namespace runs iff
    a process of that namespace has its pid there (the last of its NSpid) and its start time. A namespace no
    process is in any more has no gc running (an inode reused by a new namespace holds no process of the old)."""
    where = f"pid namespace pid:[{a.gc_pidns}]"
    link = f"pid:[{a.gc_pidns}]"
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as f:
                nspid = next((line.split()[1:] for line in f if line.startswith(b"NSpid:")), [])
            # One pid (this, the initial, namespace's): not of the gc's namespace, whose link need not be read
            # (it may be refused: another security context's init).
            if len(nspid) == 1 or os.readlink(f"/proc/{entry.name}/ns/pid") != link:
                continue
        except FileNotFoundError:
            continue  # exited meanwhile
        except OSError:
            return "unknown", f"{who} ran in {where}, whose processes cannot all be read: cannot tell whether it runs"
        if not nspid or nspid[-1] != str(a.gc_pid).encode():
            continue
        fields = _stat_fields(entry.name)
        if abs(_start_ticks(fields) - a.gc_start) <= 1 and fields and fields[0] not in (b"Z", b"X"):
            return "alive", f"{who} (host pid {entry.name}, in {where}) runs: its batch is under way"
    return "dead", f"{who} is dead (no process of {where} is that gc)"


def restore(shm_dir: str, every_gc_dead: str = "") -> list[Restored]:
    """Put each set-aside entry of a provably dead gc back under its name in ``shm_dir``, when that name is free
    (RENAME_NOREPLACE: never over an entry that took it since) and the entry is a regular file of this
    filesystem; the rest are left, each with why. Entries of a live gc, of another pid namespace and of an older
    gc (no way back) are not listed: the listing says what they are (segments/judge.py).

    ``every_gc_dead``: a proof, in a clause, that no gc runs over this tmpfs at all (preflight's init container:
    nothing but preflight uses it), which then stands for each gc's, whatever its pid namespace."""
    done: list[Restored] = []
    try:
        dfd = os.open(shm_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return done  # the scan that follows says what is wrong with the dir (HostError), as without this step
    try:
        dev = os.fstat(dfd).st_dev
        states: dict[tuple[int, int, int], tuple[GcState, str]] = {}
        try:
            with os.scandir(dfd) as it:
                asides = [e.name for e in it if e.name.startswith(ASIDE_PREFIX)]
        except OSError:
            return done
        for name in asides:
            a = parse_aside(name)
            if a is None:
                continue
            key = (a.gc_pid, a.gc_start, a.gc_pidns)
            if every_gc_dead:
                state, why = "dead", f"gc pid {a.gc_pid} is dead ({every_gc_dead})"
            else:
                state, why = states[key] if key in states else states.setdefault(key, gc_state(a))
            if state != "dead":
                continue
            try:
                st = os.lstat(name, dir_fd=dfd)
            except FileNotFoundError:
                continue  # another run put it back, or unlinked it
            if not stat.S_ISREG(st.st_mode) or st.st_dev != dev:
                done.append(Restored(name, a.original, False, f"{why}; not a regular file of this dir: left"))
                continue
            try:
                rename_noreplace(dfd, name, a.original)
            except OSError as err:
                if err.errno == errno.ENOENT:
                    continue
                taken = "its name is taken again" if err.errno == errno.EEXIST else err.strerror
                done.append(Restored(name, a.original, False, f"{why}; {taken}: left, inspect and remove by hand"))
                continue
            done.append(Restored(name, a.original, True, f"{why}: put back under its name"))
    finally:
        with contextlib.suppress(OSError):
            os.close(dfd)
    return done


def aside_reason(name: str, shm_dir: str, states: dict[tuple[int, int, int], tuple[GcState, str]]) -> tuple[bool, str]:
    """How the listing judges a set-aside entry: (its gc runs, the reason). ``states``: the caller's cache, per gc."""
    a = parse_aside(name)
    if a is None:
        return (
            False,
            "set aside by a gc --delete that did not finish, with no way back recorded; inspect, remove by hand",
        )
    key = (a.gc_pid, a.gc_start, a.gc_pidns)
    state, why = states[key] if key in states else states.setdefault(key, gc_state(a))
    if state == "alive":
        return True, f"set aside as {a.original} by {why}; never touched"
    if state == "unknown":
        return False, f"set aside as {a.original}; {why}; left"
    if os.path.lexists(os.path.join(shm_dir, a.original)):
        return False, f"set aside as {a.original}; {why}, and its name is taken again: inspect, remove by hand"
    return False, f"set aside as {a.original}; {why}: gc --delete puts it back under its name and judges it"


__all__ = [
    "INIT_PID_NS_INO",
    "RENAME_NOREPLACE",
    "GcState",
    "Restored",
    "aside_reason",
    "gc_state",
    "rename_noreplace",
    "restore",
    "this_gc_aside",
]
