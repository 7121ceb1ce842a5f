"""The dashboard's pages: login, the team's batches with live progress, file downloads, results so far.

A login checks the API key with the app's `Authenticator`, as the API checks its headers, and opens a
session (`gateway.callers.logins` keeps it in the store: this module reads the cookie and writes nothing):
the HttpOnly, SameSite=Strict cookie scoped to /ui holds a random session id, never the key, and every
request maps it back to the key's team (any replica over the same store can), so the owner it names is the
only owner any query here asks for: another team's batch or file is never listed and its id answers 404.
Sessions lapse after `SESSION_TTL_SECONDS`; logout closes it. The cookie is `Secure` when the request came
over https, as uvicorn sees it: its `X-Forwarded-Proto` from a proxy that
`serve --forwarded-allow-ips` trusts included.

The login and logout posts must come from our own pages (login CSRF: another site must not log a browser into
its team): their `Origin` (else their `Referer`) must be this server's own origin, or they get a 403. The
pages send `Referrer-Policy: same-origin`, so a browser sends our origin on them and `null` from elsewhere.
The key is never logged and never written into a page. With no keys configured the dashboard is open, like
the API.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from gateway.api import batches, files
from gateway.api.auth import Authenticator, Principal
from gateway.api.dashboard.daily_spend import SpendChart, spend_chart
from gateway.api.dashboard.view import FILTERS, BatchView, batch_view
from gateway.api.dashboard.webhooks import install_json, recent_deliveries
from gateway.api.deps import bad_request, runtime_of
from gateway.api.http_errors import ApiError
from gateway.api.teams_view import team_states
from gateway.callers.logins import SESSION_TTL_SECONDS
from gateway.config.prices import route_prices
from gateway.config.routes import RouteKind
from gateway.config.schema import Config
from gateway.domain import MESSAGE_BATCH_KIND
from gateway.errors import not_found
from gateway.pipeline.sweeper import background_routes, unavailable_routes
from gateway.store.faults import noticed, waiting_words
from gateway.store.protocols import Store
from gateway.store.records import BatchRecord, Page

PREFIX = "/ui"
COOKIE = "batchyard_session"
PAGE_SIZE = 20
_MAX_FORM_BYTES = 8 * 1024
_HERE = Path(__file__).parent
STATIC_DIR = _HERE / "static"

_env = Environment(
    loader=FileSystemLoader(_HERE / "templates"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters.update(FILTERS)

# No inline script or style, nothing from elsewhere, never framed; pages are per-user and not cached.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # our origin on our own posts (the login's check), nothing to others
    "Cache-Control": "no-store",
}

router = APIRouter(prefix=PREFIX)


# -- who is looking ----------------------------------------------------------


def _auth(request: Request) -> Authenticator:
    return request.app.state.auth


async def _viewer(request: Request) -> Principal | None:
    """The caller the cookie's session names; None when it is missing, lapsed, or its key no longer valid."""
    auth = _auth(request)
    if not auth.enabled:
        return auth.authenticate(None)  # open gateway: everyone is owner ""
    session_id = request.cookies.get(COOKIE)
    if not session_id or len(session_id) > 128:
        return None
    digest = await runtime_of(request).logins.digest_of(session_id)
    return auth.by_digest(digest) if digest is not None else None


def _same_origin(request: Request) -> bool:
    """Whether a post comes from this server's own pages: its `Origin` (else its `Referer`'s origin) is ours,
    the scheme as uvicorn sees it (a trusted proxy's `X-Forwarded-Proto` included) and the `Host` it asked."""
    host = request.headers.get("host", "").lower()
    own = f"{request.url.scheme}://{host}"
    origin = request.headers.get("origin")
    if origin is None:
        referer = request.headers.get("referer")
        if not referer:
            return False
        try:
            parts = urlsplit(referer)
        except ValueError:
            return False
        origin = f"{parts.scheme}://{parts.netloc}"
    return bool(host) and origin.lower() == own


def _cross_site(request: Request) -> Response:
    return _page(request, "login.html", status=403,
                 error="This form can only be sent from the dashboard's own pages. Open the login page and try again.")


def _to_login() -> RedirectResponse:
    return RedirectResponse(f"{PREFIX}/login", status_code=303, headers=_HEADERS)


def _page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    context.setdefault("auth_enabled", _auth(request).enabled)
    html = _env.get_template(template).render(prefix=PREFIX, **context)
    return HTMLResponse(html, status_code=status, headers=_HEADERS)


# -- login and logout --------------------------------------------------------


@router.get("/login", response_model=None)
async def login_form(request: Request) -> Response:
    if await _viewer(request) is not None:
        return RedirectResponse(PREFIX, status_code=303, headers=_HEADERS)
    return _page(request, "login.html")


@router.post("/login", response_model=None)
async def login(request: Request) -> Response:
    if not _same_origin(request):
        return _cross_site(request)
    if not _auth(request).enabled:
        return RedirectResponse(PREFIX, status_code=303, headers=_HEADERS)
    key = (await _form(request)).get("api_key", "").strip()
    try:
        _auth(request).authenticate(key)
    except ApiError:
        await asyncio.sleep(0.5)  # a little friction for guessing from a browser
        message = "Enter your team's API key." if not key else "That API key is not valid. Check it and try again."
        return _page(request, "login.html", status=401, error=message)
    session_id = await runtime_of(request).logins.open(key)
    reply = RedirectResponse(PREFIX, status_code=303, headers=_HEADERS)
    reply.set_cookie(COOKIE, session_id, max_age=SESSION_TTL_SECONDS, path=PREFIX, httponly=True,
                     samesite="strict", secure=request.url.scheme == "https")
    return reply


@router.post("/logout", response_model=None)
async def logout(request: Request) -> Response:
    if not _same_origin(request):
        return _cross_site(request)
    session_id = request.cookies.get(COOKIE)
    if session_id and len(session_id) <= 128:
        await runtime_of(request).logins.close(session_id)
    reply = _to_login()
    reply.delete_cookie(COOKIE, path=PREFIX, httponly=True, samesite="strict")
    return reply


async def _form(request: Request) -> dict[str, str]:
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > _MAX_FORM_BYTES:
            raise ApiError(413, "The form is too large.", code="request_too_large")
    fields = parse_qs(raw.decode("utf-8", errors="replace"), keep_blank_values=True)
    return {name: values[0] for name, values in fields.items()}


# -- batches -----------------------------------------------------------------


@router.get("", response_model=None)
@router.get("/", response_model=None)
async def batches_page(request: Request, limit: str = str(PAGE_SIZE), after: str | None = None,
                       team: str | None = None) -> Response:
    viewer = await _viewer(request)
    if viewer is None:
        return _to_login()
    size = _limit(limit)
    charts = await _charts(request, viewer, team)
    page, views = await _batches(request, viewer, size, after)
    query = {"limit": size, **({"after": after} if after else {})}
    chosen = {"team": team} if team is not None else {}  # the chart's team stays chosen while paging
    older = {**chosen, "limit": size, "after": page.data[-1].id} if page.has_more and page.data else None
    teams = [t for t in await team_states(runtime_of(request)) if viewer.admin or t.team == viewer.owner]
    return _page(
        request,
        "batches.html",
        viewer=viewer,
        teams=teams,
        charts=charts,
        selected=team,
        batches=views,
        has_more=page.has_more,
        older="?" + urlencode(older) if older else None,
        newest="?" + urlencode({**chosen, "limit": size}) if after else None,
        poll_url=f"{PREFIX}/api/batches?{urlencode(query)}",
        deliveries=await recent_deliveries(request, viewer),
    )


async def _charts(request: Request, viewer: Principal, team: str | None) -> list[SpendChart]:
    """The spend charts the viewer may see: a team's key its own team's; the master key (or an open gateway)
    each configured team's, or only `team` (with none configured, its own: an open gateway's batches).
    Another team's name, or an unknown one, is a 404, as `GET /v1/spend?team=` answers it."""
    runtime = runtime_of(request)
    configured = [t.team_id for t in runtime.config.batch.teams]
    if team is not None and team != viewer.owner and not (viewer.admin and team in configured):
        raise not_found("team", team[:64], param="team")
    names = [team] if team is not None else configured if viewer.admin and configured else [viewer.owner]
    return [await spend_chart(runtime, name) for name in names]


@router.get("/api/batches")
async def batches_json(
    request: Request, limit: str = str(PAGE_SIZE), after: str | None = None, done: str = ""
) -> JSONResponse:
    """What the page's script polls: the page's batch ids, newest first, and fresh cards for all of them
    but those in `done` (the ones the page already shows finished: their cards no longer change)."""
    viewer = await _viewer(request)
    if viewer is None:
        raise ApiError(401, "Log in again: the dashboard session has ended.", code="invalid_api_key")
    page, views = await _batches(request, viewer, _limit(limit), after, skip={i for i in done.split(",") if i})
    template = _env.get_template("_card.html")
    cards = {v.id: template.render(b=v, prefix=PREFIX) for v in views}
    return JSONResponse(
        {"ids": [b.id for b in page.data], "has_more": page.has_more, "cards": cards}, headers=_HEADERS
    )


async def _batches(
    request: Request, viewer: Principal, limit: int, after: str | None, skip: Collection[str] = ()
) -> tuple[Page, list[BatchView]]:
    """One page of the viewer's batches (newest first), and views of those to render: all but the
    finished ones named in `skip`."""
    runtime = runtime_of(request)
    store = runtime.store
    page = await store.batches.page(viewer.owner, limit=limit, after=after)
    records: list[BatchRecord] = page.data
    wanted = [r for r in records if not (r.status.finished and r.id in skip)]
    stats = await asyncio.gather(*(store.ledger.route_stats(r.id) for r in wanted))
    planned = await asyncio.gather(*(_planned(store, r) for r in wanted))
    inputs = await asyncio.gather(*(store.files.get(r.input_file_id, r.files_owner) for r in wanted))
    workers = await runtime.coordination.live_workers() if wanted else []
    unavailable = unavailable_routes(workers)
    now = time.time()
    waiting = waiting_words(_paused(workers))
    unpriced = _unpriced(runtime.config, {name for s in stats for name in s} | {n for p in planned for n in p or ()})
    background = background_routes(workers)
    return page, [batch_view(r, s, p, now, unavailable, waiting, background, unpriced=unpriced,
                             input_filename=f.filename if f is not None else None)
                  for r, s, p, f in zip(wanted, stats, planned, inputs, strict=True)]


def _unpriced(config: Config, names: Collection[str]) -> set[str]:
    """The local routes among `names` whose config gives no price (`run --dry-run` says "unpriced"): their
    cost is unknown, not $0.00. Upstream and native routes are priced by LiteLLM's map as well."""
    found = set()
    for name in names:
        route = config.route(name) if name else None
        if route is not None and route.kind is RouteKind.LOCAL and route_prices(route.model_info.litellm_keys) is None:
            found.add(name)
    return found


def _paused(workers: list[dict[str, Any]]) -> dict[str, float]:
    """The faults of the machine that hold work back (kind -> since): this process's own (a full disk in
    embedded mode stops the workers' heartbeats too) and those the live workers' heartbeats carry."""
    faults = noticed()
    for info in workers:
        for kind, since in (info.get("paused") or {}).items():
            faults[kind] = min(float(since), faults.get(kind, float(since)))
    return faults


async def _planned(store: Store, rec: BatchRecord) -> dict[str, int] | None:
    """Requests per route of a running batch, from its shards (a finished batch's counts say it all)."""
    if rec.status.finished:
        return None
    planned: dict[str, int] = {}
    for shard in await store.ledger.get_shards(rec.id):
        planned[shard.route] = planned.get(shard.route, 0) + shard.size
    return planned


def _limit(raw: str) -> int:
    if not raw.strip().isdigit() or not 1 <= int(raw) <= 100:
        raise bad_request(f"limit must be an integer between 1 and 100, got {raw!r}.", param="limit")
    return int(raw)


# -- webhooks ----------------------------------------------------------------

webhooks_router = install_json(PREFIX, _viewer, _HEADERS)


# -- files -------------------------------------------------------------------


@router.get("/files/{file_id}/content", response_model=None)
async def file_content(request: Request, file_id: str) -> Response:
    """A file's bytes, as `GET /v1/files/{id}/content` gives them: the viewer's own files only."""
    viewer = await _viewer(request)
    if viewer is None:
        return _to_login()
    return await files.file_content(request, viewer, file_id)


@router.get("/batches/{batch_id}/results", response_model=None)
async def batch_results(request: Request, batch_id: str, after: str | None = None, limit: int = 1000) -> Response:
    """A batch's results so far, as `GET /v1/batches/{id}/results` gives them: the viewer's own batches only."""
    viewer = await _viewer(request)
    if viewer is None:
        return _to_login()
    if batch_id.startswith(MESSAGE_BATCH_KIND + "_"):  # a Message Batch's: its id, checked as any other
        return await batches.results_reply(request, viewer, batch_id, after, limit)
    return await batches.batch_results(request, viewer, batch_id, after, limit)
