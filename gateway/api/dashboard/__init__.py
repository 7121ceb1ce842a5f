"""The dashboard at /ui: a team's batches with live progress, behind a login with the team's API key.

Server-rendered Jinja2 templates, one stylesheet and one small script that polls
`/ui/api/batches`; no build step and nothing fetched from elsewhere.
`install(app)` mounts it on the gateway's app.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from gateway.api.dashboard.pages import PREFIX, STATIC_DIR, router, webhooks_router


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.include_router(webhooks_router)
    app.mount(f"{PREFIX}/static", StaticFiles(directory=STATIC_DIR), name="ui-static")
