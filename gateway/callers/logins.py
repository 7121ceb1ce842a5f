"""The dashboard's login sessions, as the API asks for them (`gateway.api.dashboard.pages` parses the cookie and
the form, and shapes the reply; the store's `sessions` part is written here only).

A login opens a session for the API key that logged in: a random session id (`new_session_id`) for the
browser's cookie, and in the store, under the id's SHA-256 (`session_name`), the key's digest and when the
session ends, `SESSION_TTL_SECONDS` after the login (`gateway.store.sessions`). Every dashboard request asks
for the digest back by the cookie's id; logout closes the session.
"""

from __future__ import annotations

import time

from gateway.store.protocols import DashboardSessions
from gateway.store.sessions import SESSION_TTL_SECONDS, Session, key_digest, new_session_id, session_name


class Logins:
    """The dashboard's sessions over the store's `sessions` part."""

    def __init__(self, sessions: DashboardSessions) -> None:
        self._sessions = sessions

    async def open(self, key: str) -> str:
        """A new session for the (already checked) API key `key`: its id, for the cookie. The key itself is
        never stored, only its digest."""
        session_id = new_session_id()
        session = Session(key_digest(key), time.time() + SESSION_TTL_SECONDS)
        await self._sessions.open(session_name(session_id), session)
        return session_id

    async def digest_of(self, session_id: str) -> str | None:
        """The digest of the key that opened the session `session_id`; None when there is none or it lapsed."""
        session = await self._sessions.get(session_name(session_id))
        return session.key_digest if session is not None else None

    async def close(self, session_id: str) -> None:
        """End the session (logout); nothing happens for one that is gone."""
        await self._sessions.close(session_name(session_id))


__all__ = ["SESSION_TTL_SECONDS", "Logins"]
