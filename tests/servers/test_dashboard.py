"""The dashboard at /ui, in a real headless browser.

Debian's chromium, driven by Playwright, against a real gateway process with
two teams and the loopback upstream. Team A logs in through the form, submits a
batch with the openai SDK and watches it run and finish; team B sees none of it.
The screenshot is kept in tests/artifacts/dashboard.png (and, with
BATCHYARD_DOCS_SCREENSHOT=1, in docs/dashboard.png for the README).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, sync_playwright

from gateway.api.dashboard.view import fmt_usd
from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import (
    REPO_ROOT,
    Gateway,
    chat_line,
    gateway_config,
    start_gateway,
    submit,
    wait_batch,
)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
ARTIFACTS = REPO_ROOT / "tests" / "artifacts"
KEY_A, KEY_B, KEY_ADMIN = "sk-team-a-dashboard", "sk-team-b-dashboard", "sk-admin-dashboard"
LINES = 12
NATIVE_PRICES = {"input_cost_per_token_batches": 2.5e-4, "output_cost_per_token_batches": 1e-3}
STEP_MS = 700  # line i answers after i * STEP_MS: the batch runs for several seconds, finishing line by line
WAIT_MS = 90_000


def _need_chromium() -> None:
    if Path(CHROMIUM).exists():
        return
    reason = f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium; scripts/test.sh does)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    teams = [
        {"team_id": "team-a", "api_keys": [KEY_A], "models": ["gpt-mini", "gpt-azure", "gpt-cheap"]},
        {"team_id": "team-b", "api_keys": [KEY_B]},
    ]
    config = gateway_config(upstream, teams=teams, master_key=KEY_ADMIN)
    # A native route with batch prices, so the cost column has something to show.
    config["model_list"].append({
        "model_name": "gpt-cheap",
        "litellm_params": {"model": "openai/gpt-4o-mini", "api_base": upstream.v1_url, "api_key": upstream.api_key},
        "model_info": {"batch_mode": "native", "native_poll_max_seconds": 0.2, **NATIVE_PRICES},
    })
    with start_gateway(config, tmp_path_factory.mktemp("dashboard") / "data") as server:
        yield server


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    _need_chromium()
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def _login(browser: Browser, gateway: Gateway, key: str) -> Page:
    """A fresh browser context logged in through the form; returns its page."""
    context = browser.new_context(viewport={"width": 1100, "height": 600}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto(gateway.url + "/ui")
    assert page.url.endswith("/ui/login")  # not logged in: sent to the form
    page.fill("#api_key", key)
    page.click("button[type=submit]")
    page.wait_for_selector("#batches", state="attached")
    return page


def test_login_rejects_a_wrong_key(browser: Browser, gateway: Gateway) -> None:
    context = browser.new_context()
    page = context.new_page()
    page.goto(gateway.url + "/ui/login")
    page.fill("#api_key", "sk-not-a-real-key")
    with page.expect_response(lambda r: r.url.endswith("/ui/login") and r.request.method == "POST") as reply:
        page.click("button[type=submit]")
    assert reply.value.status == 401
    assert "That API key is not valid" in page.inner_text("#login-error")
    assert "sk-not-a-real-key" not in page.content()  # never echoed back
    assert context.cookies() == []
    # Without a session the pages send to the form and the polling endpoint says 401 in OpenAI's shape.
    page.goto(gateway.url + "/ui")
    assert page.url.endswith("/ui/login")
    direct = gateway.http("GET", "/ui")
    assert direct.status_code == 303 and direct.headers["location"] == "/ui/login"
    error = httpx.get(gateway.url + "/ui/api/batches", timeout=10)
    assert error.status_code == 401 and error.json()["error"]["code"] == "invalid_api_key"
    context.close()


def test_team_watches_its_batch_and_other_team_sees_nothing(browser: Browser, gateway: Gateway) -> None:
    page = _login(browser, gateway, KEY_A)
    assert page.inner_text("#team") == "team-a"
    cookie = next(c for c in page.context.cookies() if c["name"] == "batchyard_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    assert KEY_A not in cookie["value"]  # a session id, never the key
    assert KEY_A not in page.content()
    page.evaluate("window.__notReloaded = true")  # progress must arrive by polling, not by reloading
    problems: list[str] = []  # script errors and console errors (a CSP violation is one)
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)

    client = gateway.client(KEY_A)
    lines = [chat_line(f"r{i}", "gpt-mini", f"hello number {i} #sleep:{i * STEP_MS}") for i in range(1, LINES - 3)]
    lines += [chat_line(f"z{i}", "gpt-azure", f"azure hello {i} #sleep:{i * STEP_MS}") for i in (1, 2)]
    lines += [chat_line(f"n{i}", "gpt-cheap", f"a cheap question {i}") for i in (1, 2)]
    batch = submit(client, lines)
    card = f'.batch[data-id="{batch.id}"]'

    # While it runs: the new batch appears on its own, in progress, with per-route rows and a partial count.
    page.wait_for_selector(f'{card}[data-status="in_progress"] .route-row[data-route="gpt-mini"]')
    page.wait_for_function(
        """([sel, total]) => {
            const el = document.querySelector(sel + ' .progress-count');
            const m = el && el.textContent.match(/^(\\d+) \\/ (\\d+)$/);
            return m && +m[2] === total && +m[1] >= 1 && +m[1] < total;
        }""",
        arg=[card, LINES],
    )
    running = page.locator(card)
    # Every route is listed from the start with its own done / total, the native one too (its results come last).
    planned = {
        row.get_attribute("data-route"): row.locator(".route-progress").inner_text()
        for row in running.locator(".route-row").all()
    }
    assert set(planned) == {"gpt-mini", "gpt-azure", "gpt-cheap"}
    assert [planned[r].split(" / ")[1] for r in ("gpt-mini", "gpt-azure", "gpt-cheap")] == [str(LINES - 4), "2", "2"]
    assert running.locator(".status").inner_text() == "in_progress"
    assert re.fullmatch(r"[\d.]+ req/s", running.locator(".rate").inner_text())
    assert running.locator(".eta").inner_text().startswith("~")
    assert running.locator(".output-link").count() == 0
    page.screenshot(path=str(_artifact("dashboard-running.png")))

    # After it finishes: completed, every count, tokens and cost as the API reports them, the output file.
    page.wait_for_selector(f'{card}[data-status="completed"]')
    assert page.evaluate("window.__notReloaded") is True
    done = wait_batch(client, batch.id)
    assert done.status == "completed" and done.usage is not None
    finished = page.locator(card)
    assert finished.locator(".progress-count").inner_text() == f"{LINES} / {LINES}"
    assert finished.locator(".completed").inner_text() == str(LINES)
    assert finished.locator(".failed").inner_text() == "0"
    assert finished.locator(".eta").inner_text() == "done"
    assert finished.locator(".usage").inner_text() == f"{done.usage.input_tokens} / {done.usage.output_tokens}"
    assert done.usage.input_tokens > 0 and done.usage.output_tokens > 0
    rows = {
        row.get_attribute("data-route"): [cell.inner_text() for cell in row.locator("td").all()]
        for row in finished.locator(".route-row").all()
    }
    assert set(rows) == {"gpt-mini", "gpt-azure", "gpt-cheap"}
    counts = {name: cells[1:4] for name, cells in rows.items()}  # requests, completed, failed
    mini = str(LINES - 4)
    assert counts == {"gpt-mini": [mini, mini, "0"], "gpt-azure": ["2", "2", "0"], "gpt-cheap": ["2", "2", "0"]}
    tokens = {name: (int(cells[4].replace(",", "")), int(cells[5].replace(",", ""))) for name, cells in rows.items()}
    assert tuple(map(sum, zip(*tokens.values(), strict=True))) == (done.usage.input_tokens, done.usage.output_tokens)
    # The native route is priced at its batch rates; the real-time ones are not priced (yet) in this config.
    cheap_in, cheap_out = tokens["gpt-cheap"]
    cheap_cost = cheap_in * NATIVE_PRICES["input_cost_per_token_batches"] + cheap_out * NATIVE_PRICES[
        "output_cost_per_token_batches"
    ]
    assert cheap_cost > 0 and rows["gpt-cheap"][6] == fmt_usd(cheap_cost)
    assert all(re.fullmatch(r"\$[\d,]+\.\d{2,6}", cells[6]) for cells in rows.values())
    costs = [float(cells[6].lstrip("$").replace(",", "")) for cells in rows.values()]
    assert finished.locator(".cost").inner_text() == fmt_usd(sum(costs))
    with page.expect_download() as download:
        finished.locator(".output-link").click()
    downloaded = Path(download.value.path()).read_text()
    assert downloaded == client.files.content(done.output_file_id).text
    assert sorted(line["custom_id"] for line in map(json.loads, downloaded.splitlines())) == sorted(
        line["custom_id"] for line in lines
    )

    # A batch that fails validation shows its errors (line 2 names a model team A may not use).
    bad = submit(client, [chat_line("ok", "gpt-mini", "fine"), chat_line("nope", "secret-model", "hi")])
    page.wait_for_selector(f'.batch[data-id="{bad.id}"][data-status="failed"] .errors')
    errors = page.locator(f'.batch[data-id="{bad.id}"] .errors').inner_text()
    assert "line 2" in errors and "model_not_found" in errors
    page.wait_for_selector(f'{card}[data-status="completed"]')  # still listed, below the newer one
    ids = [el.get_attribute("data-id") for el in page.locator(".batch").all()]
    assert ids[:2] == [bad.id, batch.id]  # newest first
    assert page.evaluate("window.__notReloaded") is True  # a batch that was born finished came by polling too

    # The spend chart (drawn when the page loads): the batch's day holds its cost, as GET /v1/spend reports it.
    page.reload()
    day = dt.datetime.fromtimestamp(done.created_at, dt.UTC).date().isoformat()
    reported = httpx.get(f"{gateway.url}/v1/spend", params={"group_by": "day"},
                         headers={"Authorization": f"Bearer {KEY_A}"}, timeout=10).json()
    assert [row["day"] for row in reported["data"]] == [day]
    spent = reported["data"][0]["cost_usd"]
    assert spent == pytest.approx(sum(costs), abs=1e-5) and spent > 0
    assert page.locator("#spend .spend").count() == 1  # a team sees its own chart only
    chart = page.locator('#spend .spend[data-team="team-a"]')
    _assert_chart(chart, day, spent)
    assert chart.locator(".spend-reserved").inner_text() == "reserved $0.00"  # the batch ended: nothing held
    _screenshot(page)

    assert problems == []

    # Team B: its page lists none of team A's batches, A's file link is a 404, and asking for A's card gets nothing.
    page_b = _login(browser, gateway, KEY_B)
    assert page_b.inner_text("#team") == "team-b"
    assert page_b.locator(".batch").count() == 0
    assert page_b.locator("#empty").is_visible()
    assert batch.id not in page_b.content()
    # B's chart is B's: thirty empty days; A's chart is not on it, and asking for it is a 404.
    assert [el.get_attribute("data-team") for el in page_b.locator("#spend .spend").all()] == ["team-b"]
    empty = page_b.locator('#spend .spend[data-team="team-b"]')
    assert {el.get_attribute("data-cost") for el in empty.locator(".spend-day").all()} == {"0.0"}
    assert empty.locator(".spend-total").inner_text() == "total $0.00"
    assert empty.locator(".spend-max").inner_text() == "no spend"
    assert fmt_usd(spent) not in page_b.inner_text("#spend")
    peek = page_b.context.request.get(f"{gateway.url}/ui?team=team-a")
    assert peek.status == 404 and peek.json()["error"]["code"] == "not_found"
    stolen = page_b.context.request.get(f"{gateway.url}/ui/files/{done.output_file_id}/content")
    assert stolen.status == 404 and stolen.json()["error"]["code"] == "not_found"
    polled = page_b.context.request.get(f"{gateway.url}/ui/api/batches?limit=20&done={batch.id}")
    assert polled.status == 200 and polled.json() == {"ids": [], "has_more": False, "cards": {}}
    page_b.context.close()

    # The master key sees every team's chart, or the one it picks from the teams table.
    admin = _login(browser, gateway, KEY_ADMIN)
    assert [el.get_attribute("data-team") for el in admin.locator("#spend .spend").all()] == ["team-a", "team-b"]
    _assert_chart(admin.locator('#spend .spend[data-team="team-a"]'), day, spent)
    admin.click('#teams tr[data-team="team-b"] a')
    admin.wait_for_url(re.compile(r".*/ui\?team=team-b$"))
    assert [el.get_attribute("data-team") for el in admin.locator("#spend .spend").all()] == ["team-b"]
    assert admin.context.request.get(f"{gateway.url}/ui?team=no-such-team").status == 404
    admin.context.close()

    # Log out: the session ends, and the page sends back to the form.
    page.click("text=Log out")
    page.wait_for_url(re.compile(r".*/ui/login$"))
    assert [c for c in page.context.cookies() if c["name"] == "batchyard_session"] == []
    page.goto(gateway.url + "/ui")
    assert page.url.endswith("/ui/login")
    page.context.close()


def _assert_chart(chart: Locator, day: str, spent: float) -> None:
    """A chart whose only spending day is `day`, at `spent`: thirty columns, that one the full height, each
    column's hover title its date and amount, the total and the highest day labelled."""
    columns = chart.locator(".spend-day").all()
    assert len(columns) == 30 and columns[-1].get_attribute("data-day") == dt.datetime.now(dt.UTC).date().isoformat()
    costs = {el.get_attribute("data-day"): float(el.get_attribute("data-cost") or "nan") for el in columns}
    assert costs[day] == pytest.approx(spent, abs=1e-9) and sum(costs.values()) == costs[day]
    column = chart.locator(f'.spend-day[data-day="{day}"]')
    assert column.locator("title").text_content() == f"{day}: {fmt_usd(costs[day])}"
    assert float(column.locator(".spend-bar").get_attribute("height") or 0) == 100  # the highest day: full height
    assert all(float(el.locator(".spend-bar").get_attribute("height") or 1) == 0
               for el in columns if el.get_attribute("data-day") != day)
    assert chart.locator(".spend-total").inner_text() == f"total {fmt_usd(costs[day])}"
    assert chart.locator(".spend-max").inner_text() == f"highest {fmt_usd(costs[day])} on {day}"


def _artifact(name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / name


def _screenshot(page: Page) -> None:
    path = _artifact("dashboard.png")
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    if os.environ.get("BATCHYARD_DOCS_SCREENSHOT") == "1":
        (REPO_ROOT / "docs").mkdir(exist_ok=True)
        (REPO_ROOT / "docs" / "dashboard.png").write_bytes(path.read_bytes())


def test_open_gateway_needs_no_login(
    browser: Browser, upstream: Upstream, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """With no keys configured the dashboard is open, like the API: no form, no logout."""
    with start_gateway(gateway_config(upstream), tmp_path_factory.mktemp("open") / "data") as server:
        client = server.client(None)
        batch = wait_batch(client, submit(client, [chat_line("only", "gpt-mini", "hi there")]).id)
        assert batch.status == "completed"
        context = browser.new_context()
        page = context.new_page()
        page.goto(server.url + "/ui/login")
        assert page.url.endswith("/ui")  # nothing to log in to
        card = page.locator(f'.batch[data-id="{batch.id}"]')
        assert card.get_attribute("data-status") == "completed"
        assert card.locator(".progress-count").inner_text() == "1 / 1"
        assert "open gateway" in page.inner_text(".account")
        assert page.locator("text=Log out").count() == 0
        output = context.request.get(server.url + card.locator(".output-link").get_attribute("href"))
        assert output.status == 200 and output.text() == client.files.content(batch.output_file_id).text
        context.close()


def test_failure_is_not_shown_as_success_and_an_unavailable_route_keeps_its_reason(
    browser: Browser, upstream: Upstream, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A `completed` batch whose lines mostly failed is red, not green, with its failed lines in their own
    colour; a local route whose engine cannot start says why after a restart (the reason is kept with the
    batch, not only in the workers' heartbeats) and costs "unpriced", not $0.00; each card names its input
    file and shows its metadata."""
    root = tmp_path_factory.mktemp("failures")
    config = gateway_config(upstream)
    missing = root / "no-such-model"
    config["model_list"].append({"model_name": "broken-local", "litellm_params": {"model": f"vllm/{missing}"}})
    with start_gateway(config, root / "data") as server:
        client = server.client(None)
        lines = [chat_line(f"bad{i}", "gpt-mini", f"refused {i} #fail:400") for i in range(3)]
        mostly = wait_batch(client, submit(client, [*lines, chat_line("good", "gpt-mini", "fine")],
                                           filename="mostly-failing.jsonl", metadata={"project": "newcomer"}).id)
        local = wait_batch(client, submit(client, [chat_line(f"l{i}", "broken-local", "hi") for i in range(2)],
                                          filename="local.jsonl").id)
        assert (mostly.status, mostly.request_counts.failed, local.status) == ("completed", 3, "completed")
        why = client.batches.retrieve(local.id).model_extra["routes"]["broken-local"]["unavailable"]  # the API's
        assert str(missing) in why and "does not exist" in why
    with start_gateway(config, root / "data") as server:  # restarted: no worker has met the route since
        page = browser.new_context(viewport={"width": 1100, "height": 700}).new_page()
        page.goto(server.url + "/ui")
        card = page.locator(f'.batch[data-id="{mostly.id}"]')
        assert card.get_attribute("data-status") == "completed" and card.get_attribute("data-outcome") == "failed"
        assert "outcome-failed" in (card.get_attribute("class") or "")
        assert card.locator(".badge.failed-lines").inner_text() == "3 failed"
        assert card.locator(".input-file").inner_text() == "mostly-failing.jsonl"
        assert card.locator(".metadata").inner_text().split() == ["project", "newcomer"]
        red = "rgb(192, 57, 43)"  # --bad: the status badge and the bar's failed part, not --ok's green
        assert card.locator(".badge.status").evaluate("e => getComputedStyle(e).color") == red
        assert card.locator(".bar-failed").evaluate("e => getComputedStyle(e).fill") == red
        assert int(card.locator(".bar-failed").get_attribute("width") or 0) == 750
        assert int(card.locator(".bar-ok").get_attribute("width") or 0) == 250
        broken = page.locator(f'.batch[data-id="{local.id}"]')
        row = broken.locator('.route-row[data-route="broken-local"]')
        assert row.locator(".badge.unavailable").count() == 1
        assert str(missing) in row.locator(".route-unavailable").inner_text()
        assert row.locator(".route-cost").inner_text() == "unpriced"
        assert broken.locator(".cost").inner_text() == "unpriced"
        assert broken.get_attribute("data-outcome") == "failed"
        page.screenshot(path=str(_artifact("dashboard-failures.png")), full_page=True)
        page.context.close()
