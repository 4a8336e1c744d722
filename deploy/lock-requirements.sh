#!/usr/bin/env bash
# Make deploy/node-requirements.lock from deploy/node-requirements.txt: every package the image
# installs (the base dependencies and theirs), pinned to one version with the sha256 of each of its
# files on PyPI (pip-compile --generate-hashes), so `pip install --require-hashes` in the image build
# refuses anything else. The hashes cover every wheel of a version, x86_64 and aarch64 alike.
#
# Usage: deploy/lock-requirements.sh [--upgrade]
#   --upgrade  take the newest versions the requirements allow (else keep the locked ones)
# Resolves with the image's Python minor version (3.11, Debian bookworm's): set PYTHON to a
# python3.11 when python3 is another. pip-tools is installed into a temporary venv and removed.
# tests/unit/test_deploy.py checks that the lock covers exactly the requirements, each line hashed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
upgrade=()
for arg in "$@"; do
    case $arg in
        --upgrade) upgrade=(--upgrade) ;;
        -h | --help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "lock-requirements: unknown argument: $arg" >&2; exit 2 ;;
    esac
done
py=${PYTHON:-python3}
minor=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$minor" = 3.11 ] || { echo "lock-requirements: $py is Python $minor, the image's is 3.11 (set PYTHON)" >&2; exit 5; }

venv=$(mktemp -d /tmp/smgshm-lock.XXXXXX)
trap 'rm -rf "$venv"' EXIT
# PyPI only: this host's pip config (local indexes, find-links, constraints) must not shape the lock.
export PIP_CONFIG_FILE=/dev/null
unset PIP_FIND_LINKS PIP_EXTRA_INDEX_URL PIP_INDEX_URL PIP_CONSTRAINT
"$py" -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check 'pip-tools==7.7.0'
cd "$here"
CUSTOM_COMPILE_COMMAND=deploy/lock-requirements.sh "$venv/bin/pip-compile" --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url \
    --no-emit-find-links "${upgrade[@]}" \
    --output-file node-requirements.lock node-requirements.txt
