"""Whether a command can be exec'ed, asked before anything is done on its behalf.

preflight as a wrapper reclaims, checks, writes its verdict, then execs the gateway (same pid). An exec that
fails after the verdict was written leaves the run two things to say on one channel, and has reclaimed for a
gateway that never starts; so what the kernel would refuse is asked first: the name found on PATH as execvp
finds it (executable), a regular file, and a format the kernel runs (ELF of this machine, or ``#!`` with an
interpreter that can be run). A format binfmt_misc may run (it has entries: qemu-user, a jar) is left to exec.
What still fails at exec (a missing ELF interpreter, E2BIG) is said after the verdict, on stderr.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat

_ELF = b"\x7fELF"
_BINFMT_MISC = "/proc/sys/fs/binfmt_misc"


def _elf_id(head: bytes) -> bytes:
    """EI_CLASS and EI_DATA, then e_machine (in the file's byte order): what makes an ELF this machine's."""
    return head[4:6] + head[18:20]


def _binfmt_misc_in_use() -> bool:
    """Whether binfmt_misc has a format registered (then the kernel may run more than ELF and #!)."""
    with contextlib.suppress(OSError):
        return any(n not in ("register", "status") for n in os.listdir(_BINFMT_MISC))
    return False


def _head(path: str, n: int = 256) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, n) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return None
    finally:
        os.close(fd)


def exec_refusal(name: str) -> str | None:
    """Why exec'ing ``name`` (a command name or path, as execvp takes it) would fail, in words that follow
    "the command to exec"; None when it looks runnable, or cannot be told (an unreadable file: exec decides)."""
    path = shutil.which(name)
    if path is None:
        return "is not found"
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return "is not a regular file"
    except OSError:
        return "is not found"
    head = _head(path)
    if head is None:
        return None
    if head.startswith(b"#!"):
        line = head[2:].split(b"\n", 1)[0].strip()
        interp = os.fsdecode(line.split()[0]) if line else ""
        if not interp or not os.path.isfile(interp) or not os.access(interp, os.X_OK):
            return f"names an interpreter that cannot be run ({interp or 'none'})"
        return None
    if _binfmt_misc_in_use():
        return None
    if head.startswith(_ELF):
        own = _head("/proc/self/exe")
        if own is not None and own.startswith(_ELF) and _elf_id(own) != _elf_id(head):
            return "is an executable of another machine"
        return None
    return "is in no executable format (neither ELF nor #!)"


__all__ = ["exec_refusal"]
