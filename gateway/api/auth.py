"""Who is calling: API keys from the config, mapped to a team.

Keys come from `general_settings.master_key` (an admin: owner "", every model)
and `batch_settings.teams[].api_keys` (owner = the team id, models = the team's
list). A key is sent as `Authorization: Bearer K` (OpenAI), `api-key: K`
(Azure) or `x-api-key: K` (Anthropic). With no key configured the gateway is open and every caller is owner "".
Keys are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass

from fastapi import Request

from gateway.api.http_errors import ApiError
from gateway.config.schema import Config

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller: the owner of what it creates and the models it may use (None: all)."""

    owner: str
    models: frozenset[str] | None
    admin: bool = False

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models

    @property
    def allowed_models(self) -> list[str] | None:
        return None if self.models is None else sorted(self.models)


OPEN = Principal(owner="", models=None, admin=True)


class Authenticator:
    def __init__(self, config: Config) -> None:
        self._keys: list[tuple[bytes, Principal]] = []
        self._digests: list[tuple[bytes, Principal]] | None = None  # the keys' SHA-256, made on first use
        if config.master_key:
            self._keys.append((config.master_key.encode(), OPEN))
        for team in config.batch.teams:
            models = None if team.models is None else frozenset(team.models)
            principal = Principal(owner=team.team_id, models=models)
            self._keys.extend((key.encode(), principal) for key in team.api_keys)

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def by_digest(self, digest: str) -> Principal | None:
        """The caller whose key has this SHA-256 (`gateway.store.sessions.key_digest`: what a dashboard session
        holds instead of the key); None when no configured key has it (taken out of the config)."""
        if self._digests is None:
            from gateway.store.sessions import key_digest

            self._digests = [(key_digest(key.decode()).encode(), principal) for key, principal in self._keys]
        given = digest.encode()
        found: Principal | None = None
        for candidate, principal in self._digests:  # no early exit, as in `authenticate`
            if hmac.compare_digest(given, candidate) and found is None:
                found = principal
        return found

    def authenticate(self, key: str | None) -> Principal:
        if not self._keys:
            return OPEN
        if not key:
            raise ApiError(
                401,
                "You didn't provide an API key. Send it as 'Authorization: Bearer KEY' or as an 'api-key' header.",
                code="missing_api_key",
            )
        given = key.encode()
        found: Principal | None = None
        for candidate, principal in self._keys:  # no early exit: the time taken doesn't depend on which key matched
            if hmac.compare_digest(given, candidate) and found is None:
                found = principal
        if found is None:
            raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")
        return found


def _key_from(request: Request) -> str | None:
    auth = request.headers.get("authorization")
    if auth:
        scheme, _, value = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    api_key = request.headers.get("api-key") or request.headers.get("x-api-key")
    return api_key.strip() if api_key else None


def current_principal(request: Request) -> Principal:
    """FastAPI dependency: the authenticated caller, or a 401."""
    auth: Authenticator = request.app.state.auth
    return auth.authenticate(_key_from(request))


def log_auth_mode(auth: Authenticator) -> None:
    if not auth.enabled:
        log.warning("no API keys configured (general_settings.master_key, batch_settings.teams): the API is open")
