"""Matching a receiver's receipts to the tensors sent: the one rule behind "verified".

A receiver is a peer, and a peer can be wrong or lie. A request is verified only when
every tensor sent has exactly one receipt, found by its key (never by position or by
count), carrying a digest under the expected algorithm that equals the sender's. A
duplicate, a receipt under a key that was never sent, a missing receipt or a missing
digest is a mismatch, named by its key. ``send``, ``probe --verify`` and ``bench`` all
judge receipts here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from smgshm.core.closed import Closed
from smgshm.core.transport.tensors import digest_mismatch
from smgshm.core.transport.wire import Layout


def receipt_key(layout: Layout, extra: str | None = None) -> str:
    """The key a receiver reports for a tensor: the primary (``extra=None``) or a model-specific one.

    The same names ``wire.parse_multimodal`` gives (tests/test_verify.py holds them equal).
    """
    e = layout.engine
    prefix = "items[0]." if e.mm_items else ""  # build_multimodal puts every tensor in one item
    return f"{prefix}{e.primary_tensor}" if extra is None else f"{prefix}model_specific_tensors[{extra}]"


@dataclass(frozen=True)
class Sent:
    """What the receiver must vouch for, per key."""

    key: str
    digest: bytes | None  # None: not verifying bytes (--no-verify); the keys are still matched
    payload_kind: str  # inline | shm
    nbytes: int


class ProblemKind(Closed):
    """What went wrong with a tensor or a request of a send (receipts judged here give the first two)."""

    MISMATCH = "mismatch"  # a verification failure: a digest, a duplicate, a missing or unknown key
    RECEIVER_ERROR = "receiver_error"  # the receiver refused that tensor
    RPC_FAILED = "rpc_failed"  # the request's RPC failed
    LEFTOVER = "leftover"  # its segment was still there after the receiver answered
    NOT_SENT = "not_sent"  # requests the run did not send


@dataclass(frozen=True)
class Issue:
    key: str
    kind: ProblemKind  # mismatch (a verification failure) | receiver_error (the receiver refused that tensor)
    message: str


@dataclass(frozen=True)
class Verdict:
    """One request's receipts judged: which keys verified, and what is wrong with the rest."""

    verified: tuple[str, ...]
    issues: tuple[Issue, ...]
    receipts: int

    @property
    def mismatches(self) -> int:
        return sum(1 for i in self.issues if i.kind is ProblemKind.MISMATCH)

    @property
    def receiver_errors(self) -> int:
        return sum(1 for i in self.issues if i.kind is ProblemKind.RECEIVER_ERROR)

    @property
    def ok(self) -> bool:
        return not self.issues


def judge(sent: Sequence[Sent], receipts: Sequence[Any]) -> Verdict:
    """Judge ``receipts`` (``TensorReceipt`` messages, or anything with the same fields) against ``sent``."""
    want = {s.key: s for s in sent}
    counts = Counter(str(r.key) for r in receipts)
    issues: list[Issue] = []
    verified: list[str] = []
    for key, n in sorted(counts.items()):
        if key not in want:
            issues.append(Issue(key, ProblemKind.MISMATCH, f"{n} receipt(s) for a key that was never sent"))
        elif n > 1:
            issues.append(Issue(key, ProblemKind.MISMATCH, f"{n} receipts for one tensor (duplicates)"))
    for one in sent:
        if counts[one.key] == 0:
            issues.append(Issue(one.key, ProblemKind.MISMATCH, "no receipt for this tensor"))
    for r in receipts:
        s = want.get(str(r.key))
        if s is None or counts[s.key] != 1:
            continue  # already judged above
        if r.error.code:
            issues.append(Issue(s.key, ProblemKind.RECEIVER_ERROR, f"{r.error.code}: {r.error.message}"[:300]))
            continue
        why = _why(s, r)
        if why:
            issues.append(Issue(s.key, ProblemKind.MISMATCH, why))
        else:
            verified.append(s.key)
    return Verdict(tuple(verified), tuple(issues), len(receipts))


def _why(s: Sent, r: Any) -> str | None:
    if r.payload_kind != s.payload_kind:
        return f"the receiver reports payload_kind {r.payload_kind or 'unset'!r}, {s.payload_kind!r} was sent"
    if int(r.nbytes) != s.nbytes:
        return f"the receiver reports {r.nbytes} bytes, {s.nbytes} were sent"
    if s.digest is None:
        return None
    if not r.digest:
        return "the receipt carries no digest"
    return digest_mismatch(r.digest_algo, r.digest, s.digest)


__all__ = ["Issue", "Sent", "Verdict", "judge", "receipt_key"]
