"""`Idempotency-Key` on the creates (`POST /files`, `POST /batches`), the HTTP side: the key read from the
request, the replies shaped. The semantics (Stripe's), the claim and every store write are
`gateway.callers.idempotent_creates`'; this module writes nothing.

The key is the `Idempotency-Key` header; for a batch also `idempotency_key` in the body, as Llama Stack's
clients send it through the SDK's `extra_body`. A replay is the first object (as it is now) with
`Idempotent-Replayed: true`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from gateway.api.deps import bad_request, runtime_of
from gateway.callers.idempotent_creates import Claim
from gateway.store.idempotency import IdempotencyEntry

HEADER = "Idempotency-Key"
BODY_FIELD = "idempotency_key"  # Llama Stack's clients' batch body field
MAX_KEY_CHARS = 255  # Stripe's limit


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
    return runtime_of(request).idempotent_creates.claim(owner, key, param)


async def made(claim: Claim, fingerprint: str, kind: str, object_id: str, body: dict[str, Any],
               status: int = 200) -> JSONResponse:
    """The work made its object: the claim remembers it for replays, and the object is the answer."""
    await claim.complete(fingerprint, kind, object_id, body, status)
    return JSONResponse(body, status_code=status)


async def replay(claim: Claim, first: IdempotencyEntry, fingerprint: str,
                 current: Callable[[str], Awaitable[dict[str, Any] | None]]) -> JSONResponse:
    """The first request's object for the same request (`current`: it as it is now, by id; None when gone,
    then the object as first answered); a 400 naming the key for another request."""
    result = claim.first_answer(first, fingerprint)
    body = await current(str(result["id"])) or result["body"]
    return JSONResponse(body, status_code=int(result["status"]), headers={"Idempotent-Replayed": "true"})


__all__ = ["BODY_FIELD", "HEADER", "MAX_KEY_CHARS", "claim_for", "made", "replay"]
