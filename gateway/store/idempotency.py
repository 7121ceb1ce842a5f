"""The teams' idempotency keys: the `idempotency` part of the `Store` (both modes keep it beside the records).

A create (`POST /files`, `POST /batches`) sent with an `Idempotency-Key` reserves the key for its team before
it does any work, in one atomic step (a SQL transaction, a Redis script): of two requests with one key,
exactly one gets the reservation. The winner makes the object and `complete`s the entry with what it
answered (the object's kind, id, status and body) and the request's fingerprint; a failure `release`s it,
so a retry may make the object after all. Anyone else finds the entry: still in progress (the claim waits a
little, then the API answers 409), or finished (the claim compares fingerprints: the same request gets the
first object back, another one a 400). The claim, and every write of this part, is
`gateway.callers.idempotent_creates`'.

An entry is kept `KEY_TTL_SECONDS` after it was made (Stripe's 24 hours). A reservation is held for the
`hold` its request asked for: one not completed by then was left by a process that died mid-request, and
the next request with that key takes it over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KEY_TTL_SECONDS = 24 * 3600  # how long a finished entry answers replays


@dataclass(frozen=True, slots=True)
class IdempotencyEntry:
    """One key of one team. `result` is None while the request that reserved it runs, then
    {"kind": "file" | "batch", "id", "status", "body"} (`body`: the object as first answered)."""

    token: str  # the reserving request's own random id: only it may complete or release the entry
    fingerprint: str  # "" until completed where the request's is only known at its end (an upload's bytes)
    created_at: float
    result: dict[str, Any] | None = None

    @property
    def done(self) -> bool:
        return self.result is not None

    def to_json(self) -> dict[str, Any]:
        return {"token": self.token, "fingerprint": self.fingerprint, "created_at": self.created_at,
                "result": self.result}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> IdempotencyEntry:
        return cls(str(data["token"]), str(data["fingerprint"]), float(data["created_at"]), data.get("result"))


__all__ = ["KEY_TTL_SECONDS", "IdempotencyEntry"]
