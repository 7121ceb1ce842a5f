"""The dashboard's spend chart lays out `GET /v1/spend`'s per-day rows: thirty days, empty ones as zero bars,
the costliest day full height and a day with any cost never drawn as nothing."""

from __future__ import annotations

import datetime as dt

import pytest

from gateway.api.dashboard.daily_spend import DAYS, HEIGHT, WIDTH, chart_of
from gateway.api.spend import Row

SINCE = int(dt.datetime(2026, 10, 30, tzinfo=dt.UTC).timestamp())


def test_every_day_has_a_bar_scaled_to_the_costliest() -> None:
    rows = [Row("t", "2026-11-02", None, cost_usd=2.0, reserved_usd=0.5),
            Row("t", "2026-11-20", None, cost_usd=8.0),
            Row("t", "2026-11-28", None, cost_usd=1e-6)]
    chart = chart_of("t", rows, SINCE)
    days = [b.day for b in chart.bars]
    assert len(days) == DAYS and days[0] == "2026-10-30" and days[-1] == "2026-11-28"
    heights = {b.day: b.height for b in chart.bars}
    assert heights["2026-11-20"] == HEIGHT and heights["2026-11-02"] == HEIGHT / 4
    assert heights["2026-11-28"] == 1.0  # a millionth of the top is still a visible bar
    assert sum(1 for h in heights.values() if h == 0) == DAYS - 3
    assert [b.x for b in chart.bars] == sorted({b.x for b in chart.bars})  # one column per day, left to right
    assert chart.bars[-1].x + chart.bars[-1].width <= WIDTH
    assert all(b.y + b.height == HEIGHT for b in chart.bars)  # bars stand on the baseline
    assert chart.total_usd == pytest.approx(10.000001) and chart.reserved_usd == 0.5
    assert chart.max_bar is not None and (chart.max_bar.day, chart.max_bar.cost_usd) == ("2026-11-20", 8.0)


def test_a_team_that_spent_nothing_has_thirty_empty_days() -> None:
    chart = chart_of("t", [], SINCE)
    assert [b.cost_usd for b in chart.bars] == [0.0] * DAYS and {b.height for b in chart.bars} == {0.0}
    assert chart.max_bar is None and chart.total_usd == 0.0 and chart.reserved_usd == 0.0
