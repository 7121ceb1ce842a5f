"""`Idempotency-Key` on the creates (`POST /files`, `POST /batches`), with Stripe's semantics: the claim a
create makes on its key, and everything it writes in the store (`gateway.api.idempotency` reads the key from
the request and shapes the replies; it writes nothing itself).

A client that times out on a create and sends it again must not make (and pay for) a second object. With a
key, the request first reserves it for its team in the store (`gateway.store.idempotency`: atomic, shared by
every process of both modes), then does the work:

- the same team, key and request within 24 hours gets the first object back (its id and status code, the
  object as it is now; `Idempotent-Replayed: true`), and nothing new is made;
- the same key with another request (its `fingerprint`: a batch's JSON parameters; an upload's purpose,
  filename, expires_after and the sha256 of its bytes) is a 400 `idempotency_error` naming the key;
- while the first request with the key still runs, a second one waits up to `WAIT_SECONDS` for its answer,
  then gets a 409 `idempotency_key_in_use` (try again later);
- a create that fails keeps nothing: its reservation goes, and a retry may make the object.

Another team's key of the same text is another key.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import Conflict, InvalidRequest, shown
from gateway.store.idempotency import IdempotencyEntry
from gateway.store.protocols import IdempotencyKeys

WAIT_SECONDS = 10.0  # how long a request waits for the first one with its key (then 409)
# How long a reservation holds before a dead process's is taken over: a batch create counts the file's lines
# for the team's quotas at most; an upload streams a file of up to `max_file_bytes`.
BATCH_HOLD, FILE_HOLD = 300.0, 3600.0
_FIRST_POLL, _MAX_POLL = 0.02, 0.5


def fingerprint(kind: str, params: Mapping[str, Any]) -> str:
    """The request, as compared with the first one that used its key (its kind too: a file's key reused for a
    batch is another request)."""
    text = json.dumps([kind, params], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class IdempotentCreates:
    """The creates' claims, over the store's `idempotency` part."""

    def __init__(self, keys: IdempotencyKeys) -> None:
        self._keys = keys

    def claim(self, owner: str, key: str, param: str) -> Claim:
        """A request's claim on its team's `key` (`param`: where the request sent it, named in errors);
        nothing is reserved until `Claim.take`."""
        return Claim(self._keys, owner, key, param)


@dataclass
class Claim:
    """One request's hold on its team's key."""

    keys: IdempotencyKeys
    owner: str
    key: str
    param: str  # where the key came from, named in errors
    token: str = field(default_factory=lambda: secrets.token_hex(16))

    async def take(self, hold: float, fingerprint: str = "") -> IdempotencyEntry | None:
        """None: the key is this request's now, do the work. Else the first request's finished entry (waited for
        while it runs; `Conflict` past `WAIT_SECONDS`). Each try is the store's atomic reserve, so a first
        request that failed (its reservation released) leaves the key to whichever waiter tries next."""
        deadline, pause = time.monotonic() + WAIT_SECONDS, _FIRST_POLL
        while True:
            entry = await self.keys.reserve(self.owner, self.key, self.token, fingerprint, hold)
            if entry is None or entry.done:
                return entry
            if time.monotonic() >= deadline:
                raise Conflict(f"A request with the idempotency key '{shown(self.key)}' is still being processed. "
                               "Try again once it has finished.", code="idempotency_key_in_use", param=self.param)
            await asyncio.sleep(pause)
            pause = min(pause * 2, _MAX_POLL)

    async def drop(self) -> None:
        """The work failed (or was cut off): the key is free again for a retry."""
        await asyncio.shield(self.keys.release(self.owner, self.key, self.token))

    async def complete(self, fingerprint: str, kind: str, object_id: str, body: dict[str, Any],
                       status: int = 200) -> None:
        """The work made its object (`body`: as answered, with `status`): remember it for replays."""
        result = {"kind": kind, "id": object_id, "status": status, "body": body}
        await self.keys.complete(self.owner, self.key, self.token, fingerprint, result)

    def first_answer(self, first: IdempotencyEntry, fingerprint: str) -> dict[str, Any]:
        """The first request's answer ({"kind", "id", "status", "body"}) for the same request; `InvalidRequest`
        naming the key for another one."""
        result = first.result
        if result is None or first.fingerprint != fingerprint:
            raise InvalidRequest(f"Keys for idempotent requests can only be used with the same parameters they "
                                 f"were first used with. Try using a key other than '{shown(self.key)}' if you "
                                 "meant to execute a different request.", code="idempotency_error", param=self.param)
        return result


__all__ = ["BATCH_HOLD", "FILE_HOLD", "WAIT_SECONDS", "Claim", "IdempotentCreates", "fingerprint"]
