"""`batchyard spend`: a team's spend from a gateway's `GET /v1/spend`, as a table (or the CSV the gateway writes).

The key is read from OPENAI_API_KEY (as `batchyard submit` reads it), the URL from --base-url or OPENAI_BASE_URL;
one of them is required, so the key never goes to a default host.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import httpx

from gateway.cli.console import say

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
_COLUMNS = ("team", "day", "route", "requests", "input_tokens", "output_tokens", "cost_usd", "reserved_usd")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("spend", help="print a team's spend per day and route, from a gateway",
                       description="Print what a team spent per day (UTC) and per route: cost, tokens, requests and "
                       "the amount its running batches hold, from the gateway's GET /v1/spend. The key is read "
                       "from OPENAI_API_KEY; a team's key reads its own team's, the master key any team's.")
    p.add_argument("--base-url", help="the gateway's API root, e.g. http://gateway:4000/v1 (default: "
                   "$OPENAI_BASE_URL; one of the two is required: the key never goes to a default host)")
    p.add_argument("--start", help="the window's start: unix seconds or an ISO date (default: 30 days before --end)")
    p.add_argument("--end", help="the window's end (excluded): unix seconds or an ISO date (default: now)")
    p.add_argument("--group-by", default="day,route", choices=("day", "route", "day,route"),
                   help="rows per day, per route, or per day and route (default: day,route)")
    p.add_argument("--team", help="the team to report (the master key only; default: the key's own team, or "
                   "every team for the master key)")
    p.add_argument("--csv", action="store_true", help="print CSV (the gateway's text/csv reply) instead of a table")


def spend_command(args: argparse.Namespace) -> int:
    base_url = args.base_url or os.environ.get("OPENAI_BASE_URL")
    if not base_url:
        say("no gateway to ask: pass --base-url (e.g. http://gateway:4000/v1) or set OPENAI_BASE_URL")
        return EXIT_USAGE
    key = os.environ.get("OPENAI_API_KEY", "")
    params = {k: v for k, v in {"start": args.start, "end": args.end, "group_by": args.group_by,
                                "team": args.team}.items() if v}
    headers = {"authorization": f"Bearer {key}", "accept": "text/csv" if args.csv else "application/json"}
    try:
        reply = httpx.get(base_url.rstrip("/") + "/spend", params=params, headers=headers, timeout=60,
                          trust_env=False)
    except httpx.HTTPError as exc:
        say(f"could not reach the gateway at {base_url} ({type(exc).__name__})")
        return EXIT_UNREACHABLE
    if reply.status_code != 200:
        try:
            message = reply.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = reply.text[:200]
        say(f"the gateway refused: HTTP {reply.status_code}: {message}")
        return EXIT_USAGE if reply.status_code in (401, 403) else EXIT_REFUSED
    if args.csv:
        sys.stdout.write(reply.text)
        return EXIT_OK
    body = reply.json()
    sys.stdout.write(table(body["data"]))
    sys.stdout.write(f"total cost {body['total_cost_usd']:.6f} USD, reserved {body['total_reserved_usd']:.6f} USD"
                     + (" (more batches than one reply reads: narrow the window)" if body.get("has_more") else "")
                     + "\n")
    return EXIT_OK


def table(rows: list[dict[str, Any]]) -> str:
    cells = [list(_COLUMNS)] + [["" if r.get(c) is None else f"{r[c]:.6f}" if isinstance(r[c], float) else str(r[c])
                                 for c in _COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(_COLUMNS))]
    return "".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n"
                   for row in cells)


__all__ = ["add_parser", "spend_command", "table"]
