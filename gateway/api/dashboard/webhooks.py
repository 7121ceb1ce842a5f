"""The dashboard's view of webhook deliveries: the newest of the viewer's team (every team's for the
admin), with their state, attempts and the receiver's last answer. Never the URL's secret."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.api.deps import runtime_of
from gateway.api.http_errors import ApiError

if TYPE_CHECKING:
    from gateway.api.auth import Principal

SHOWN = 20

router = APIRouter()


async def recent_deliveries(request: Request, viewer: Principal, limit: int = SHOWN) -> list[dict[str, Any]]:
    owner = None if viewer.admin and viewer.owner == "" else viewer.owner
    found = await runtime_of(request).store.webhooks.recent(owner, limit)
    return [{"id": d.id, "batch_id": d.batch_id, "type": d.type, "state": d.state, "attempts": d.attempts,
             "last_status": d.last_status, "last_error": d.last_error, "created_at": d.created_at,
             "finished_at": d.finished_at, "team": d.owner} for d in found]


def install_json(prefix: str, viewer_of: Any, headers: dict[str, str]) -> APIRouter:
    """`GET {prefix}/api/webhooks`: the deliveries as JSON (what the page shows, for scripts and tests)."""

    @router.get(f"{prefix}/api/webhooks")
    async def webhooks_json(request: Request) -> JSONResponse:
        viewer = await viewer_of(request)
        if viewer is None:
            raise ApiError(401, "Log in again: the dashboard session has ended.", code="invalid_api_key")
        return JSONResponse({"data": await recent_deliveries(request, viewer)}, headers=headers)

    return router
