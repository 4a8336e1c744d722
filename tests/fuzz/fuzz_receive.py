"""An atheris (libFuzzer) target: hostile bytes as an engine's MultimodalInputs (Diagnostics
Receive) or GenerateRequest (serve's stand-in worker), into the receiver.

    python tests/fuzz/fuzz_receive.py [CORPUS_DIR] [-runs=N] [-max_total_time=S]

The Generate inputs go through serve's own path from bytes (``parse_and_read``: protowire's
excised parse, inline payloads read in place). Coverage-guided, starting from valid vLLM
and TokenSpeed messages whose handles name real segments in a private shm dir
(``$SMGSHM_FUZZ_SHM_DIR``, or a fresh temp dir; never /dev/shm). Every input must give
receipts or a WireError, and leave the dir's segments exactly as they were.
tests/test_fuzz_atheris.py runs it bounded in CI.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

import atheris

with atheris.instrument_imports(include=["smgshm"]):
    from smgshm.core.errors import WireError
    from smgshm.core.receiver.reader import ReceiverConfig, receive
    from smgshm.core.receiver.receipts import ReceiptRing
    from smgshm.core.receiver.worker import parse_and_read
    from smgshm.core.segments.io import ShmRef
    from smgshm.core.transport.wire import Layout, OutTensor, Request, build_multimodal, engine_pb2

SHM_DIR = os.environ.get("SMGSHM_FUZZ_SHM_DIR") or tempfile.mkdtemp(prefix="smgshm-fuzz-")
SEGMENTS = {"smg-smgshm-1-1-0": 4096, "smg-tokenspeed-2-2-0": 12, "smg-smgshm-3-3-0": 0}
# Segments are kept: a fuzzed handle that names one must read it, never consume it.
CFG = ReceiverConfig(shm_dir=SHM_DIR, unlink_after_read=False, namespace_id="fuzz:1")


def make_segments() -> None:
    for name, size in SEGMENTS.items():
        path = os.path.join(SHM_DIR, name)
        if not os.path.exists(path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.pwrite(fd, bytes(range(256)) * (size // 256) + bytes(size % 256), 0)
            os.close(fd)


def seeds() -> list[bytes]:
    """Valid messages of both layouts, as MultimodalInputs (lead byte < 0x40 or >= 0xc0) and
    wrapped in a GenerateRequest (0x40-0xbf): the fuzzer mutates structure, not only noise."""
    out = []
    for layout, lead, gen_lead in ((Layout.VLLM, b"\x00", b"\x40"), (Layout.TOKENSPEED, b"\xff", b"\xbf")):
        shm = OutTensor((1024,), "float32", shm=ShmRef("smg-smgshm-1-1-0", 0, 4096, "smg:1", SHM_DIR))
        small = OutTensor((3, 2), "bfloat16", shm=ShmRef("smg-tokenspeed-2-2-0", 0, 12, "smg:2", SHM_DIR))
        inline = OutTensor((2, 2), "int64", inline=bytes(32))
        empty = OutTensor((0,), "uint8", shm=ShmRef("smg-smgshm-3-3-0", 0, 0, "smg:3", SHM_DIR))
        pb = engine_pb2(layout)
        for req in (Request(shm), Request(inline, {"a": small, "b": empty}), Request(small, {"x": inline})):
            mm = build_multimodal(layout, req)
            out.append(lead + mm.SerializeToString())
            gen = pb.GenerateRequest(request_id="seed", mm_inputs=mm, stream=True)
            if layout is Layout.VLLM:
                gen.extra_mm_inputs.append(mm)
            out.append(gen_lead + gen.SerializeToString())
    return out


def snapshot() -> dict[str, tuple[int, int]]:
    return {
        n: (os.lstat(os.path.join(SHM_DIR, n)).st_ino, os.lstat(os.path.join(SHM_DIR, n)).st_size)
        for n in os.listdir(SHM_DIR)
    }


def _generate(layout: Layout, raw: bytes) -> list[Any] | None:
    """serve's Generate path from the request's bytes (protowire's excised parse, payloads read in
    place): receipts, or None when refused. It must refuse exactly what protobuf cannot parse."""
    from google.protobuf.message import DecodeError

    try:
        engine_pb2(layout).GenerateRequest.FromString(raw)
        parses = True
    except DecodeError:
        parses = False
    try:
        _, outcome = parse_and_read(layout, raw, CFG, ReceiptRing(size=64))
    except WireError as err:
        refused = err.what
        if not parses and not refused.startswith("cannot parse"):
            raise AssertionError(f"unparseable, yet refused as {refused!r}") from err
        return None
    assert parses, "protowire accepted what protobuf cannot parse"
    assert len(outcome.receipts) == len({r.seq for r in outcome.receipts})
    return list(outcome.receipts)


def test_one_input(data: bytes) -> None:
    layout = Layout.VLLM if data[:1] < b"\x80" else Layout.TOKENSPEED
    if b"\x40" <= data[:1] < b"\xc0":
        got = _generate(layout, data[1:])
        if got is None:
            return
        receipts: list[Any] = got
    else:
        try:
            receipts = receive(layout, data[1:], CFG)
        except WireError:
            return
    for r in receipts:
        assert r.ok or r.error_code, r
        if r.ok and r.payload_kind == "shm":
            assert r.nbytes <= SEGMENTS.get(r.shm_name.lstrip("/"), 0), r
    assert snapshot() == BEFORE, "a fuzzed request changed the shm dir"


def main() -> None:
    global BEFORE
    make_segments()
    BEFORE = snapshot()
    corpus = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    if corpus and not os.listdir(corpus):
        for i, s in enumerate(seeds()):
            with open(os.path.join(corpus, f"seed-{i}"), "wb") as f:
                f.write(s)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


BEFORE: dict[str, tuple[int, int]] = {}

if __name__ == "__main__":
    main()
