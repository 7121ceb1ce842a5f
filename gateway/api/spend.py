"""`GET /v1/spend`: what a team spent, per day (UTC) and per route, over a window; JSON or CSV.

The source is the team's batch records (`BatchStore.page`, newest first, so the walk stops at the first batch
created before the window and never scans the keyspace), each route's cost and tokens as the ledger counted them
(`BatchRecord.routes`; a running batch's live `route_stats`). A batch counts on the UTC day it was created. The
reserved amount is the team's holds now (`QuotaLedger.reserved`): holds are per batch, so a hold counts under
the batch's route when it has one (its `model` before any result), else under route "". At most `MAX_BATCHES`
batches are read; more, and the reply says `has_more`.

A team's key reads its own; the master key reads any team's (`team`), or every configured team's without it.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.api.deps import Caller, bad_request, runtime_of
from gateway.errors import not_found

if TYPE_CHECKING:
    from gateway.runtime.runtime import Runtime
    from gateway.store.records import BatchRecord

router = APIRouter()

MAX_BATCHES = 10_000  # batches read per reply at most (per team): the walk is bounded
_PAGE = 100
_DAY = 86_400
DEFAULT_DAYS = 30
MAX_DAYS = 366
GROUPINGS = {"day": ("day",), "route": ("route",), "day,route": ("day", "route"), "route,day": ("day", "route")}
CSV_FIELDS = ("team", "day", "route", "requests", "input_tokens", "output_tokens", "cost_usd", "reserved_usd")


@dataclass(slots=True)
class Row:
    team: str
    day: str | None
    route: str | None
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    reserved_usd: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"object": "spend", "team": self.team, "day": self.day, "route": self.route,
                "requests": self.requests, "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cost_usd": round(self.cost_usd, 9), "reserved_usd": round(self.reserved_usd, 9)}


def parse_time(text: str | None, param: str) -> int | None:
    """Unix seconds, or an ISO date or date-time (UTC unless it names its zone)."""
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise bad_request(f"Invalid '{param}': expected unix seconds or an ISO date, got {text[:64]!r}.",
                          param=param, code="invalid_value") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp())


def window(start: str | None, end: str | None) -> tuple[int, int]:
    """[start, end) in unix seconds: by default the last `DEFAULT_DAYS` days."""
    until = parse_time(end, "end") or int(time.time()) + 1
    since = parse_time(start, "start")
    since = until - DEFAULT_DAYS * _DAY if since is None else since
    if since >= until:
        raise bad_request("'start' must be before 'end'.", param="start", code="invalid_value")
    if until - since > MAX_DAYS * _DAY:
        raise bad_request(f"The window may be at most {MAX_DAYS} days.", param="start", code="invalid_value")
    return since, until


def _day(at: int) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).date().isoformat()


async def _batches(runtime: Runtime, team: str, since: int, until: int) -> tuple[list[BatchRecord], bool]:
    """The team's batches created in [since, until), newest first; and whether more were left unread."""
    found: list[BatchRecord] = []
    after: str | None = None
    read = 0
    while read < MAX_BATCHES:
        page = await runtime.store.batches.page(team, limit=_PAGE, after=after)
        for rec in page.data:
            read += 1
            if rec.created_at < since:
                return found, False
            if rec.created_at < until:
                found.append(rec)
        if not page.has_more or not page.data:
            return found, False
        after = page.data[-1].id
    return found, True


async def team_rows(runtime: Runtime, team: str, since: int, until: int,
                    keys: tuple[str, ...]) -> tuple[list[Row], bool]:
    """The team's rows for the window, grouped by `keys`; and whether batches were left unread."""
    records, more = await _batches(runtime, team, since, until)
    holds = await runtime.quotas.reserved(team)
    rows: dict[tuple[str | None, str | None], Row] = {}

    def row(day: str, route: str) -> Row:
        key = (day if "day" in keys else None, route if "route" in keys else None)
        if key not in rows:
            rows[key] = Row(team, *key)
        return rows[key]

    for rec in records:
        day = _day(rec.created_at)
        live = None if rec.status.finished else await runtime.store.ledger.route_stats(rec.id)
        routes = {name: facts for name, facts in rec.to_openai(live)["routes"].items() if name}
        for name, facts in routes.items():
            r = row(day, name)
            r.requests += int(facts.get("requests") or 0)
            r.input_tokens += int(facts.get("input_tokens") or 0)
            r.output_tokens += int(facts.get("output_tokens") or 0)
            r.cost_usd += float(facts.get("cost_usd") or 0.0)
        held = sum(usd for holder, usd in holds.items() if holder.startswith(rec.id + "/"))
        if held:
            only = next(iter(routes)) if len(routes) == 1 else rec.model if not routes else None
            row(day, only or "").reserved_usd += held
    return sorted(rows.values(), key=lambda r: (r.day or "", r.route or "")), more


def to_csv(rows: list[Row]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for r in rows:
        j = r.to_json()
        writer.writerow(["" if j[f] is None else j[f] for f in CSV_FIELDS])
    return out.getvalue()


@router.get("/spend")
async def spend(request: Request, caller: Caller, start: str | None = None, end: str | None = None,
                group_by: str = "day,route", team: str | None = None) -> Response:
    keys = GROUPINGS.get(group_by.replace(" ", ""))
    if keys is None:
        raise bad_request(f"Invalid 'group_by': {group_by[:64]!r}. Expected one of 'day', 'route', 'day,route'.",
                          param="group_by", code="invalid_value")
    since, until = window(start, end)
    runtime = runtime_of(request)
    configured = [t.team_id for t in runtime.config.batch.teams]
    if team is not None and team != caller.owner and not (caller.admin and team in configured):
        raise not_found("team", team, param="team")  # another team's spend is nobody's business: not found
    teams = [team] if team is not None else configured if caller.admin else [caller.owner]
    rows: list[Row] = []
    has_more = False
    for name in teams:
        got, more = await team_rows(runtime, name, since, until, keys)
        rows.extend(got)
        has_more = has_more or more
    if "text/csv" in request.headers.get("accept", ""):
        return Response(to_csv(rows), media_type="text/csv; charset=utf-8")
    return JSONResponse({"object": "list", "data": [r.to_json() for r in rows], "has_more": has_more,
                         "start": since, "end": until, "group_by": ",".join(keys),
                         "total_cost_usd": round(sum(r.cost_usd for r in rows), 9),
                         "total_reserved_usd": round(sum(r.reserved_usd for r in rows), 9)})


__all__ = ["CSV_FIELDS", "MAX_BATCHES", "Row", "router", "team_rows", "to_csv", "window"]
