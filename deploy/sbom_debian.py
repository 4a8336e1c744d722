"""Add the image's Debian packages to the SBOM cyclonedx-py wrote for its venv.

Run in the image build (deploy/Containerfile) by the image's own python3, standard library only:
`python3 sbom_debian.py SBOM.cdx.json` appends one CycloneDX component per installed Debian package,
read from dpkg's database by dpkg-query, with its package URL (pkg:deb/debian/NAME@VERSION?arch=...),
sorted, so the same packages give the same file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

FORMAT = "${db:Status-Abbrev}\t${Package}\t${Version}\t${Architecture}\t${source:Package}\n"


def os_release(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {k: v.strip().strip('"') for k, v in pairs}


def debian_components(dpkg_query: str, distro: str) -> list[dict[str, Any]]:
    """One component per installed package of dpkg-query's FORMAT output (status "ii")."""
    components = []
    for line in dpkg_query.splitlines():
        status, name, version, arch, source = line.split("\t")
        if status.strip() != "ii":
            continue
        purl = f"pkg:deb/debian/{name}@{quote(version, safe='')}?arch={arch}&distro={distro}"
        component: dict[str, Any] = {"type": "library", "bom-ref": purl, "name": name, "version": version}
        component["purl"] = purl
        if source and source != name:
            component["properties"] = [{"name": "debian:source", "value": source}]
        components.append(component)
    return sorted(components, key=lambda c: (c["name"], c["version"]))


def main(path: str) -> None:
    release = os_release(Path("/etc/os-release").read_text())
    distro = f"{release.get('ID', 'debian')}-{release.get('VERSION_ID', '')}"
    out = subprocess.run(["dpkg-query", "-W", "-f", FORMAT], check=True, capture_output=True, text=True).stdout
    sbom = json.loads(Path(path).read_text())
    sbom.setdefault("components", []).extend(debian_components(out, distro))
    Path(path).write_text(json.dumps(sbom, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
