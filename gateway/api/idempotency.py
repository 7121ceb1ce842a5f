"""`Idempotency-Key` on the creates (`POST /files`, `POST /batches`), with Stripe's semantics.

A client that times out on a create and sends it again must not make (and pay for) a second object. With a
key (the `Idempotency-Key` header; for a batch also `idempotency_key` in the body, as Llama Stack's clients
send it through the SDK's `extra_body`) the request first reserves the key for its team in the store
(`gateway.store.idempotency`: atomic, shared by every process of both modes), then does the work:

- the same team, key and request within 24 hours gets the first object back (its id and status code, the
  object as it is now; `Idempotent-Replayed: true`), and nothing new is made;
- the same key with another request (its fingerprint: a batch's JSON parameters; an upload's purpose,
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
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from gateway.api.deps import bad_request, runtime_of
from gateway.api.http_errors import ApiError
from gateway.errors import shown
from gateway.store.idempotency import IdempotencyEntry
from gateway.store.protocols import IdempotencyKeys

HEADER = "Idempotency-Key"
BODY_FIELD = "idempotency_key"  # Llama Stack's clients' batch body field
MAX_KEY_CHARS = 255  # Stripe's limit
WAIT_SECONDS = 10.0  # how long a request waits for the first one with its key (then 409)
# How long a reservation holds before a dead process's is taken over: a batch create counts the file's lines
# for the team's quotas at most; an upload streams a file of up to `max_file_bytes`.
BATCH_HOLD, FILE_HOLD = 300.0, 3600.0
_FIRST_POLL, _MAX_POLL = 0.02, 0.5


def claim_for(request: Request, owner: str, body_key: Any = None) -> Claim | None:
    """The request's claim on its key (header, or `body_key` from a batch body), or None when it sent none.
    A key that is not one (empty, over 255 characters, not printable text), or two that differ, is a 400."""
    header = request.headers.get(HEADER)
    if body_key is not None and not isinstance(body_key, str):
        raise bad_request(f"Invalid type for '{BODY_FIELD}': expected a string.", param=BODY_FIELD,
                          code="invalid_type")
    if header is not None and body_key is not None and header != body_key:
        raise bad_request(f"The {HEADER} header and '{BODY_FIELD}' in the body differ; send one key.",
                          param=BODY_FIELD, code="invalid_value")
    key, param = (header, HEADER) if header is not None else (body_key, BODY_FIELD)
    if key is None:
        return None
    if not 0 < len(key) <= MAX_KEY_CHARS or not key.isprintable():
        raise bad_request(f"Invalid '{param}': a key is 1 to {MAX_KEY_CHARS} printable characters.",
                          param=param, code="invalid_value")
    return Claim(runtime_of(request).store.idempotency, owner, key, param)


def fingerprint(kind: str, params: Mapping[str, Any]) -> str:
    """The request, as compared with the first one that used its key (its kind too: a file's key reused for a
    batch is another request)."""
    text = json.dumps([kind, params], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


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
        while it runs; 409 past `WAIT_SECONDS`). Each try is the store's atomic reserve, so a first request that
        failed (its reservation released) leaves the key to whichever waiter tries next."""
        deadline, pause = time.monotonic() + WAIT_SECONDS, _FIRST_POLL
        while True:
            entry = await self.keys.reserve(self.owner, self.key, self.token, fingerprint, hold)
            if entry is None or entry.done:
                return entry
            if time.monotonic() >= deadline:
                raise ApiError(409, f"A request with the idempotency key '{shown(self.key)}' is still being "
                               "processed. Try again once it has finished.", code="idempotency_key_in_use",
                               param=self.param)
            await asyncio.sleep(pause)
            pause = min(pause * 2, _MAX_POLL)

    async def drop(self) -> None:
        """The work failed (or was cut off): the key is free again for a retry."""
        await asyncio.shield(self.keys.release(self.owner, self.key, self.token))

    async def made(self, fingerprint: str, kind: str, object_id: str, body: dict[str, Any],
                   status: int = 200) -> JSONResponse:
        """The work made its object: remember it for replays, and answer it."""
        result = {"kind": kind, "id": object_id, "status": status, "body": body}
        await self.keys.complete(self.owner, self.key, self.token, fingerprint, result)
        return JSONResponse(body, status_code=status)

    async def replay(self, first: IdempotencyEntry, fingerprint: str,
                     current: Callable[[str], Awaitable[dict[str, Any] | None]]) -> JSONResponse:
        """The first request's object for the same request (`current`: it as it is now, by id; None when gone,
        then the object as first answered); a 400 naming the key for another request."""
        result = first.result
        if result is None or first.fingerprint != fingerprint:
            raise ApiError(400, f"Keys for idempotent requests can only be used with the same parameters they "
                           f"were first used with. Try using a key other than '{shown(self.key)}' if you meant "
                           "to execute a different request.", code="idempotency_error", param=self.param)
        body = await current(str(result["id"])) or result["body"]
        return JSONResponse(body, status_code=int(result["status"]), headers={"Idempotent-Replayed": "true"})


__all__ = ["BATCH_HOLD", "BODY_FIELD", "FILE_HOLD", "HEADER", "MAX_KEY_CHARS", "WAIT_SECONDS", "Claim", "claim_for",
           "fingerprint"]
