"""The team page's spend chart: the last `DAYS` UTC days' cost per day, as an SVG bar chart.

The numbers are `GET /v1/spend`'s (`gateway.api.spend.team_rows`, grouped by day), so the chart and the report
never disagree; this module only lays the days out (a day with no batch is a zero bar) and scales the bars.
The chart is drawn on the server as SVG with presentation attributes: the dashboard's CSP allows no inline
style or script. Each day is a column with a `<title>` (its date and amount) for hover.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.api.spend import Row, team_rows

if TYPE_CHECKING:
    from gateway.runtime.runtime import Runtime

DAYS = 30
WIDTH = 300  # the SVG's viewBox: one column of `_SLOT` units per day
HEIGHT = 100
_SLOT = WIDTH // DAYS
_GAP = 2
_DAY = 86_400


@dataclass(slots=True)
class DayBar:
    day: str  # YYYY-MM-DD (UTC)
    cost_usd: float
    x: int
    height: float  # in viewBox units, 0 for a day with no cost

    @property
    def y(self) -> float:
        return HEIGHT - self.height

    @property
    def width(self) -> int:
        return _SLOT - _GAP


@dataclass(slots=True)
class SpendChart:
    team: str
    bars: list[DayBar] = field(default_factory=list)
    total_usd: float = 0.0
    reserved_usd: float = 0.0  # what the window's batches hold now against the budget
    has_more: bool = False  # the report read its maximum of batches: older days may be short

    @property
    def max_bar(self) -> DayBar | None:
        """The costliest day (the latest of equals), or None when every day is zero."""
        top = max(self.bars, key=lambda b: (b.cost_usd, b.day), default=None)
        return top if top is not None and top.cost_usd > 0 else None

    @property
    def width(self) -> int:
        return WIDTH

    @property
    def height(self) -> int:
        return HEIGHT

    @property
    def first_day(self) -> str:
        return self.bars[0].day if self.bars else ""

    @property
    def last_day(self) -> str:
        return self.bars[-1].day if self.bars else ""


def _midnight(now: float) -> int:
    return int(now) - int(now) % _DAY


async def spend_chart(runtime: Runtime, team: str, now: float | None = None) -> SpendChart:
    """`team`'s chart over the `DAYS` UTC days up to and including today."""
    today = _midnight(time.time() if now is None else now)
    since = today - (DAYS - 1) * _DAY
    rows, more = await team_rows(runtime, team, since, today + _DAY, ("day",))
    return chart_of(team, rows, since, more)


def chart_of(team: str, rows: list[Row], since: int, has_more: bool = False) -> SpendChart:
    """The chart of `team`'s per-day rows (`team_rows` grouped by day) over the `DAYS` days from `since`."""
    by_day = {r.day: r for r in rows if r.day is not None}
    days = [dt.datetime.fromtimestamp(since + i * _DAY, dt.UTC).date().isoformat() for i in range(DAYS)]
    costs = [by_day[d].cost_usd if d in by_day else 0.0 for d in days]
    top = max(costs, default=0.0)
    # A day with any cost keeps at least one unit of height: a cent beside a thousand dollars is not zero.
    bars = [DayBar(d, c, i * _SLOT + _GAP // 2, max(round(HEIGHT * c / top, 2), 1.0) if c > 0 else 0.0)
            for i, (d, c) in enumerate(zip(days, costs, strict=True))]
    return SpendChart(team, bars, sum(costs), sum(r.reserved_usd for r in rows), has_more)


__all__ = ["DAYS", "HEIGHT", "WIDTH", "DayBar", "SpendChart", "chart_of", "spend_chart"]
