"""The dashboard's login sessions: the `sessions` part of the `Store` (both modes keep it beside the records).

A login makes a random session id (`new_session_id`: 256 bits from `secrets`); the browser's cookie holds that
id and nothing else. The store keeps, under the id's SHA-256 (`session_name`: a copy of the store gives no
usable cookie), the digest of the API key that logged in and when the session ends. Every dashboard request
reads it back and maps the digest to its team through the app's `Authenticator`, so a key taken out of the
config ends its sessions at once (`gateway.callers.logins` opens, reads and closes them for the dashboard: the
API writes none itself). Any API replica over the same store reads the same session; a session
lapses `SESSION_TTL_SECONDS` after login (Redis' own TTL; SQLite deletes lapsed rows as it goes), and
logout deletes it.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

SESSION_TTL_SECONDS = 8 * 3600  # a working day: the cookie's Max-Age too


def new_session_id() -> str:
    return secrets.token_urlsafe(32)


def session_name(session_id: str) -> str:
    """What the store keys a session by: the SHA-256 of its id, never the id itself."""
    return hashlib.sha256(session_id.encode()).hexdigest()


def key_digest(key: str) -> str:
    """The SHA-256 of an API key, as a session holds it (the key itself is never stored)."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Session:
    key_digest: str  # `key_digest` of the API key that logged in
    expires_at: float  # epoch seconds


__all__ = ["SESSION_TTL_SECONDS", "Session", "key_digest", "new_session_id", "session_name"]
