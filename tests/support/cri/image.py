"""A local OCI image from Debian's busybox-static, with no registry: an OCI image layout (``oci-layout``,
``index.json``, ``blobs/sha256/...``) written as a tar, the form ``ctr images import`` reads.

One uncompressed layer holds ``/bin/busybox`` and a link per applet, so ``sh``, ``sleep``, ``date``
work by name. Its default command sleeps for ever, so the same image serves as the pod sandbox's
(pause) image: the pause container only has to exist and hold the pod's namespaces.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

BUSYBOX = "/bin/busybox"
IMAGE = "localhost/smgshm-test/busybox:1"  # the name the CRI plugin sees (sandbox_image too)
SLEEP_FOREVER = ["/bin/sleep", "2000000000"]  # busybox's sleep takes seconds; no "infinity" here
_DIRS = ("bin", "dev", "etc", "proc", "sys", "tmp", "var", "var/log")


def _add(tar: tarfile.TarFile, info: tarfile.TarInfo, data: bytes | None = None) -> None:
    info.mtime = 0  # a fixed layer: the same digest on every build
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    tar.addfile(info, io.BytesIO(data) if data is not None else None)


def _layer(busybox: str) -> bytes:
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True, timeout=30).stdout.split()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in _DIRS:
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if d == "tmp" else 0o755
            _add(tar, info)
        body = Path(busybox).read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(body), 0o755
        _add(tar, info, body)
        for name in sorted(set(applets) - {"busybox"}):
            info = tarfile.TarInfo(f"bin/{name}")
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, "busybox", 0o777
            _add(tar, info)
        passwd = b"root:x:0:0:root:/:/bin/sh\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size, info.mode = len(passwd), 0o644
        _add(tar, info, passwd)
    return buf.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size, info.mode = len(data), 0o644
    _add(tar, info, data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def write_layout_tar(out: Path, name: str = IMAGE, busybox: str = BUSYBOX) -> Path:
    """The OCI image layout of a busybox image named ``name``, as a tar at ``out``."""
    layer = _layer(busybox)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": SLEEP_FOREVER, "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        cfg = _blob(tar, _json(config))
        lay = _blob(tar, layer)
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **cfg},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **lay}],
        }
        man = _blob(tar, _json(manifest))
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    **man,
                    "platform": {"architecture": "amd64", "os": "linux"},
                    # ctr names the imported image by this annotation (the full reference)
                    "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": "1"},
                }
            ],
        }
        for fname, data in (("oci-layout", _json({"imageLayoutVersion": "1.0.0"})), ("index.json", _json(index))):
            info = tarfile.TarInfo(fname)
            info.size, info.mode = len(data), 0o644
            _add(tar, info, data)
    return out
