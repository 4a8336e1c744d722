"""The exporter's verdict file for node-problem-detector (``watch --node --npd-file PATH``).

NPD's image has no Python, so smgshm cannot run as its plugin; the exporter, which judges every pod's
tmpfs anyway, writes after each full scan the verdict ``gc --node --check --npd`` would give
(core/node/npd.py), and NPD runs deploy/npd/smgshm-npd.sh, a POSIX sh script that reads it. Two lines,
plain ASCII, a few hundred bytes at most::

    smgshm-npd/1 <boot id> <boot clock, whole seconds> <status 0|1|2>
    <the one line, at most 80 characters>

The time is the boot clock (CLOCK_BOOTTIME, the first field of /proc/uptime), not the wall clock: the
wall clock can be stepped (NTP at boot, a manual set), making a fresh verdict look stale or, worse, a
stale one fresh; the boot clock only moves forward, counts suspended time, is the same in every
container of the node (pods get no time namespace), and sh reads it with its ``read`` builtin. Its
zero is this boot's, so the boot id (/proc/sys/kernel/random/boot_id) goes with it: a file left from an
earlier boot on a disk-backed hostPath is stale, whatever its number says. The plugin judges the age.

Written atomically (a temporary file in the same dir, then rename), mode 0644: a reader sees the old
file or the new one, never half of one. Nothing else in the dir is touched.
"""

from __future__ import annotations

import contextlib
import os
import re
import time

from smgshm.core.errors import HostError
from smgshm.core.node.npd import NpdVerdict

MAGIC = "smgshm-npd/1"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def boot_id() -> str:
    """This boot's id (a UUID); "-" when it cannot be read (the plugin then never calls the file fresh)."""
    try:
        with open(BOOT_ID, encoding="ascii") as f:
            text = f.read(64).strip()
    except (OSError, UnicodeDecodeError):
        return "-"
    return text if _UUID.fullmatch(text) else "-"


def render(verdict: NpdVerdict, boot: str, boot_s: int) -> str:
    """The file's text for ``verdict`` judged at ``boot_s`` (boot clock) of boot ``boot``."""
    return f"{MAGIC} {boot} {boot_s} {int(verdict.status)}\n{verdict.line}\n"


def write(path: str, verdict: NpdVerdict) -> None:
    """Replace the file at ``path`` with ``verdict``, stamped now (see the module); HostError if it cannot."""
    text = render(verdict, boot_id(), int(time.clock_gettime(time.CLOCK_BOOTTIME)))
    d, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(d, f".{base}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.fchmod(fd, 0o644)  # whatever the umask: NPD's container reads it as another uid may
            os.write(fd, text.encode("ascii"))
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise HostError(
            f"cannot write the NPD verdict file {path}: {err.strerror}",
            hint="give --npd-file a path in a writable dir (the DaemonSet's hostPath shared with NPD's pod)",
        ) from err


__all__ = ["MAGIC", "boot_id", "render", "write"]
