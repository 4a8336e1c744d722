"""Whether a command can be exec'ed, asked before anything is done on its behalf.

preflight as a wrapper reclaims, checks, writes its verdict, then execs the gateway (same pid). An exec that
fails after the verdict was written leaves the run two things to say on one channel, and has reclaimed for a
gateway that never starts; so what the kernel would refuse is asked first: the name found on PATH as execvp
finds it (executable), a regular file, and a format the kernel runs (ELF of this machine, or ``#!`` with an
interpreter that can be run). A format binfmt_misc may run (it has entries: qemu-user, a jar) is left to exec.
An interpreter is asked the same of in turn (a ``#!`` naming a script whose own ``#!`` names a missing
one fails at exec with ENOENT), as deep as the kernel follows (``BINPRM_MAX_RECURSION``); and the argument
list and environment must fit the kernel's bound (E2BIG: ``ARG_MAX``, each string ``MAX_ARG_STRLEN``).

Foresight cannot be complete, so the wrapper's contract does not rest on it: what is asked here can change
before the exec (the interpreter removed, the file opened for writing by another process: ETXTBSY), and
some refusals are the kernel's alone (a missing ELF loader, ENOMEM, an LSM). So preflight's document says
the command is exec'd next (``exec_next``), never that it ran, and an exec that fails after it exits as a
shell does (127 ENOENT, 126 otherwise) with one line on stderr: one document on stdout, whatever fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Mapping, Sequence

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


MAX_INTERP_DEPTH = 4  # the kernel's BINPRM_MAX_RECURSION: #! interpreters followed past the command itself
_POINTER = 8  # bytes of each argv and envp pointer the kernel counts against the limit (64-bit)
_STK_LIM_ARGS = 6 << 20  # fs/exec.c: the strings' limit is at most _STK_LIM / 4 * 3, whatever the stack rlimit


def exec_refusal(name: str, argv: Sequence[str] = (), env: Mapping[str, str] | None = None) -> str | None:
    """Why exec'ing ``name`` (a command name or path, as execvp takes it) with ``argv`` (the whole argument
    list, ``name`` first; none: not checked) and ``env`` (default: this process's) would fail, in words that
    follow "the command to exec"; None when it looks runnable, or cannot be told (an unreadable file: exec
    decides)."""
    path = shutil.which(name)
    if path is None:
        return "is not found"
    if argv and (why := _too_big(path, argv, os.environ if env is None else env)):
        return why
    return _format_refusal(path, 0)


def _too_big(path: str, argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """E2BIG foreseen as fs/exec.c decides it: one string over MAX_ARG_STRLEN (32 pages), or the strings
    (argv, envp and the file's name, which execve copies too) over the limit less argv's and envp's pointers;
    the limit a quarter of the stack rlimit (sysconf's ARG_MAX), at most 6 MiB (3/4 of _STK_LIM), at least
    32 pages. Borderline cases a #! interpreter's words tip over are left to exec (126 then, said)."""
    try:
        arg_max = os.sysconf("SC_ARG_MAX")
        page = os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None
    strings = [os.fsencode(a) for a in argv] + [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items()]
    longest = max(len(x) + 1 for x in strings)
    if longest > 32 * page:  # MAX_ARG_STRLEN
        return f"has an argument or environment string of {longest} bytes, over the kernel's {32 * page} (E2BIG)"
    limit = max(min(arg_max if arg_max > 0 else _STK_LIM_ARGS, _STK_LIM_ARGS), 32 * page)
    need = sum(len(x) + 1 for x in strings) + len(os.fsencode(path)) + 1 + len(strings) * _POINTER
    if need > limit:
        return f"has arguments and environment of {need} bytes, over the kernel's {limit} (E2BIG)"
    return None


def _format_refusal(path: str, depth: int) -> str | None:
    """Why the kernel would not run the file at ``path`` (depth: how many #! led to it), or None."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return "is not a regular file" if depth == 0 else f"names an interpreter that is no regular file ({path})"
    except OSError:
        return "is not found" if depth == 0 else f"names an interpreter that cannot be run ({path})"
    head = _head(path)
    if head is None:
        return None
    if head.startswith(b"#!"):
        line = head[2:].split(b"\n", 1)[0].strip()
        interp = os.fsdecode(line.split()[0]) if line else ""
        if not interp or not os.path.isfile(interp) or not os.access(interp, os.X_OK):
            return f"names an interpreter that cannot be run ({interp or 'none'})"
        if depth >= MAX_INTERP_DEPTH:
            return f"names interpreters nested deeper than the kernel follows ({MAX_INTERP_DEPTH}; ELOOP)"
        return _format_refusal(interp, depth + 1)
    if _binfmt_misc_in_use():
        return None
    if head.startswith(_ELF):
        own = _head("/proc/self/exe")
        if own is not None and own.startswith(_ELF) and _elf_id(own) != _elf_id(head):
            return (
                "is an executable of another machine"
                if depth == 0
                else f"names an interpreter of another machine ({path})"
            )
        return None
    if depth:
        return f"names an interpreter in no executable format ({path})"
    return "is in no executable format (neither ELF nor #!)"


__all__ = ["exec_refusal"]
