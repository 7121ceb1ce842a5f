"""The one retry policy (`providers.retry_policy`): the openai SDK's public retry semantics, case by case.

Each case is also put to the pinned SDK's own (private) functions, so an SDK upgrade that changes its rules
fails here instead of drifting silently.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from dataclasses import dataclass

import httpx
import openai
import pytest
from openai._models import FinalRequestOptions

from providers.retry_policy import job_call_retrying, retry_after, retry_delay, should_retry, wire_retried
from tests.support.loops import run_apart

SDK = openai.AsyncOpenAI(api_key="unused", base_url="http://127.0.0.1/")  # never sends


def _date(seconds: float) -> str:
    return email.utils.formatdate(time.time() + seconds, usegmt=True)


# (status, headers, retried?)
SHOULD = [
    (400, {}, False),
    (401, {}, False),
    (404, {}, False),
    (408, {}, True),
    (409, {}, True),
    (429, {}, True),
    (500, {}, True),
    (503, {}, True),
    (400, {"x-should-retry": "true"}, True),  # the server says so: obey
    (503, {"x-should-retry": "false"}, False),
    (429, {"retry-after": "121"}, False),  # asks for more than two minutes: not retried
    (429, {"retry-after": "120"}, True),
    (429, {"retry-after-ms": "200000"}, False),
    (429, {"retry-after": _date(600)}, False),
    (429, {"retry-after": "soon"}, True),
]


@pytest.mark.parametrize(("status", "headers", "retried"), SHOULD)
def test_which_replies_are_retried(status: int, headers: dict[str, str], retried: bool) -> None:
    assert should_retry(status, httpx.Headers(headers)) is retried
    assert SDK._should_retry(httpx.Response(status, headers=headers)) is retried


# (headers, the delay asked: None = backoff)
ASKED = [
    ({}, None),
    ({"retry-after": "3"}, 3.0),
    ({"retry-after": "1.5"}, 1.5),
    ({"retry-after-ms": "250"}, 0.25),
    ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),  # the milliseconds win
    ({"retry-after": "0"}, None),  # not a positive delay: backoff
    ({"retry-after": "500"}, None),  # over two minutes: backoff
    ({"retry-after": "nonsense"}, None),
]


@pytest.mark.parametrize(("headers", "asked"), ASKED)
@pytest.mark.parametrize("retry", [1, 2, 3, 6])
def test_how_long_a_retry_waits(headers: dict[str, str], asked: float | None, retry: int) -> None:
    wait = retry_delay(retry, httpx.Headers(headers))
    options = FinalRequestOptions(method="post", url="/", max_retries=6)
    sdk = SDK._calculate_retry_timeout(6 - retry + 1, options, httpx.Headers(headers))
    if asked is not None:
        assert wait == sdk == asked
    else:  # exponential: 0.5 s doubling, at most 8 s, jitter takes up to a quarter off
        top = min(0.5 * 2 ** (retry - 1), 8.0)
        assert 0.75 * top <= wait <= top and 0.75 * top <= sdk <= top


def test_a_retry_after_date_is_read_as_seconds_from_now() -> None:
    asked = retry_after(httpx.Headers({"retry-after": _date(30)}))
    assert asked is not None and 28 <= asked <= 31


@dataclass
class Outcome:
    again: bool
    retries: int = 2
    headers: httpx.Headers | None = None


@pytest.mark.parametrize(("outcomes", "calls"), [
    ([Outcome(False)], 1),  # a success, or a reply not worth another try: one call
    ([Outcome(True), Outcome(False)], 2),
    ([Outcome(True), Outcome(True), Outcome(True), Outcome(False)], 3),  # two retries, then the last is the answer
    ([Outcome(True, retries=0)], 1),  # num_retries 0
])
def test_the_pass_through_retries_num_retries_times(outcomes: list[Outcome], calls: int) -> None:
    fast = httpx.Headers({"retry-after-ms": "1"})
    for outcome in outcomes:
        outcome.headers = fast
    made: list[Outcome] = []

    async def attempt() -> Outcome:
        made.append(outcomes[len(made)])
        return made[-1]

    answer = run_apart(wire_retried(attempt, floor=0.0))
    assert len(made) == calls and answer is made[-1]


class Transient(Exception):
    status_code = 503


class Refused(Exception):
    status_code = 400


@pytest.mark.parametrize(("errors", "calls", "raised"), [
    ([], 1, None),
    ([Transient()], 2, None),
    ([Refused()], 1, Refused),  # not transient: raised at once
    ([Transient(), Transient()], 2, Transient),  # attempts=2: the last error is raised
    ([asyncio.CancelledError()], 1, asyncio.CancelledError),  # a cancellation is never retried
])
def test_a_batch_api_call_retries_transient_errors(errors: list[BaseException], calls: int,
                                                   raised: type[BaseException] | None) -> None:
    made = []

    async def call() -> str:
        made.append(1)
        if len(made) <= len(errors):
            raise errors[len(made) - 1]
        return "ok"

    for how in (call, lambda: call()):  # an async function, or a plain one that makes the coroutine
        made.clear()
        if raised is None:
            assert run_apart(job_call_retrying(how, attempts=2)) == "ok"
        else:
            with pytest.raises(raised):
                run_apart(job_call_retrying(how, attempts=2))
        assert len(made) == calls
