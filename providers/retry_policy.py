"""The one retry policy: which failed calls are tried again, after how long, how many times (with `tenacity`).

Every in-process retry of the gateway goes through here:

- `wire_retried`: the upstream pass-through (`providers.passthrough`), by the openai SDK's public retry
  semantics, written out below instead of calling its private `_should_retry` / `_calculate_retry_timeout`:
  a reply is retried when its `x-should-retry` header says `true`, or it says nothing and the status is
  408, 409, 429 or 5xx, unless it asks to wait longer than two minutes (`retry-after-ms`, else
  `retry-after` in seconds or as an HTTP date); the wait is that asked delay when it is within
  (0, 120] s, else exponential backoff (0.5 s doubling, at most 8 s) with jitter (up to 25% less). A
  timeout or a refused connection is retried the same way. The number of retries is the Router's
  `num_retries` (or the deployment's own), and `router_settings.retry_after` is a floor on every wait.
- `router_retried`: a line on LiteLLM's completion path. LiteLLM's Router retries every error its rules call
  retryable, its own failures too (a credential file it cannot read, a reply it cannot map: its catch-all
  `APIConnectionError`), so each try goes to the Router with `num_retries=0` (it still picks the deployment
  and walks its fallbacks after the try's failure), and the tries are counted here: at most the Router's
  `num_retries` more, while the failure is one a retry may fix (`providers.upstream_errors.retry_can_fix`)
  and the Router's own rule retries it (`should_retry_this_error`), each after the wait the pass-through takes.
- `job_call_retrying`: one call of a provider's batch API (upload, create, read, cancel), retried on a
  transient error (`providers.upstream_errors.retryable`), 4 attempts, 0.5 s doubling.
- `put_retrying`: `batchyard run -o URL`'s PUT (a presigned S3 URL), 5 attempts, 0.5 s doubling up to 8 s;
  anything but a 2xx is worth another try there.

Webhook deliveries are not retried here: theirs is a schedule kept in the store across restarts
(`webhooks.retry_delays_seconds`), not a loop in one process (`gateway.webhooks.sender`).
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    retry_if_result,
    stop_after_attempt,
    wait_exponential,
)

from providers.upstream_errors import retry_can_fix, retryable

T = TypeVar("T")

INITIAL_DELAY = 0.5  # the openai SDK's INITIAL_RETRY_DELAY
MAX_DELAY = 8.0  # its MAX_RETRY_DELAY
MAX_RETRY_AFTER = 120.0  # its MAX_RETRY_AFTER_DELAY: a server asking for longer is not retried
RETRY_STATUSES = frozenset({408, 409, 429})  # and every 5xx


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """The delay a reply asks for, in seconds: `retry-after-ms`, else `retry-after` (seconds or an HTTP date)."""
    if headers is None:
        return None
    try:
        return float(headers.get("retry-after-ms", None)) / 1000  # type: ignore[arg-type]
    except (TypeError, ValueError):
        pass
    header = headers.get("retry-after")
    try:
        return float(header)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        pass
    try:
        date = email.utils.parsedate_tz(header)  # type: ignore[arg-type]
        if date is None:
            return None
        return float(email.utils.mktime_tz(date) - time.time())
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def should_retry(status: int, headers: Mapping[str, str] | None) -> bool:
    """Whether a non-2xx reply is worth another try, by the openai SDK's rules."""
    asked = retry_after(headers)
    if asked is not None and math.isfinite(asked) and asked > MAX_RETRY_AFTER:
        return False
    said = headers.get("x-should-retry") if headers is not None else None
    if said in ("true", "false"):  # the server says whether to retry: obey
        return said == "true"
    return status in RETRY_STATUSES or status >= 500


def retry_delay(retry: int, headers: Mapping[str, str] | None) -> float:
    """How long to wait before retry number `retry` (1 for the first): the reply's asked delay within two
    minutes, else exponential backoff with jitter."""
    asked = retry_after(headers)
    if asked is not None and math.isfinite(asked) and 0 < asked <= MAX_RETRY_AFTER:
        return asked
    backoff = min(INITIAL_DELAY * 2.0 ** min(retry - 1, 1000), MAX_DELAY)
    return max(backoff * (1 - 0.25 * random.random()), 0.0)


class Attempt(Protocol):
    """One pass-through attempt's outcome, as the policy reads it."""

    @property
    def again(self) -> bool:
        """Worth another try: `should_retry` said so of its reply, or no reply came (timeout, no connection)."""

    @property
    def retries(self) -> int:
        """How many retries the deployment it went to allows (the Router's `num_retries`, or its own)."""

    @property
    def headers(self) -> Mapping[str, str] | None:
        """The reply's headers (None: no reply)."""


A = TypeVar("A", bound=Attempt)


async def wire_retried(attempt: Callable[[], Awaitable[A]], floor: float) -> A:
    """One line on the pass-through: `attempt()` until its outcome is not worth another try or the retries run
    out; the last outcome is the answer. `floor`: `router_settings.retry_after`, the least wait.

    The first try runs outside tenacity: its machinery costs ~70 us a call, a tenth of a line's CPU on the
    pass-through, and most lines never retry. It is then handed in as tenacity's first attempt, so the
    count and the waits are tenacity's from the start."""
    first = await attempt()
    if not first.again:
        return first
    tried = [first]

    async def again() -> A:
        return tried.pop() if tried else await attempt()

    def stop(state: RetryCallState) -> bool:
        outcome: Attempt = state.outcome.result()  # type: ignore[union-attr]
        return state.attempt_number > outcome.retries

    def wait(state: RetryCallState) -> float:
        outcome: Attempt = state.outcome.result()  # type: ignore[union-attr]
        return max(retry_delay(state.attempt_number, outcome.headers), floor)

    retrying = AsyncRetrying(retry=retry_if_result(lambda outcome: outcome.again), stop=stop, wait=wait,
                             retry_error_callback=lambda state: state.outcome.result())  # type: ignore[union-attr]
    answer: A = await retrying(again)
    return answer


async def router_retried(call: Callable[[int], Awaitable[T]], router: Any, group: str) -> T:
    """`call(num_retries)` through LiteLLM's Router for a line of model group `group`, each try with no retries
    of the Router's own: retried here while a retry may fix the failure, as many times as the failed deployment's
    `num_retries` says, else the Router's."""
    retries: int | None = None
    attempt = 0
    while True:
        try:
            return await call(0)
        except Exception as exc:
            retries = _retries(router, exc, group) if retries is None else retries
            attempt += 1
            if attempt > retries or not retry_can_fix(exc) or not _router_retries(router, exc, group):
                raise
            headers = getattr(getattr(exc, "response", None), "headers", None)
            headers = headers if isinstance(headers, Mapping) else None
            await asyncio.sleep(max(retry_delay(attempt, headers), float(getattr(router, "retry_after", 0) or 0)))


def _retries(router: Any, exc: Exception, group: str) -> int:
    """The retries a failed line gets, as the Router counts them: its deployment's own `num_retries` (the
    Router stamps the failure with the deployment's id), else the Router's."""
    failed = getattr(exc, "failed_deployment_id", None)
    for deployment in router.registry().deployments(group) or []:
        if failed is not None and (deployment.get("model_info") or {}).get("id") == failed:
            own = (deployment.get("litellm_params") or {}).get("num_retries")
            if own is not None:
                return int(own)
    return int(router.num_retries or 0)


def _router_retries(router: Any, exc: Exception, group: str) -> bool:
    """LiteLLM's Router's own rule (`should_retry_this_error`, which raises for no): a bad request, a missing
    model, a key refused by a group's only deployment are not retried."""
    deployments = list(router.registry().deployments(group) or [])
    settings = router.settings()
    try:
        return bool(router.should_retry_this_error(
            exc, healthy_deployments=deployments, all_deployments=deployments,
            context_window_fallbacks=settings.context_window_fallbacks,
            content_policy_fallbacks=settings.content_policy_fallbacks, regular_fallbacks=settings.fallbacks))
    except Exception:  # its answer "no": the error itself, raised
        return False


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, Exception) and retryable(exc)  # never a cancellation


async def job_call_retrying(call: Callable[[], Awaitable[T]], attempts: int = 4) -> T:
    """`call()` until it succeeds or fails for good: transient errors retried, waiting 0.5 s, 1 s, 2 s."""
    async def attempt() -> T:  # a coroutine function: tenacity runs any other callable as a sync one
        return await call()

    retrying = AsyncRetrying(retry=retry_if_exception(_transient), stop=stop_after_attempt(attempts),
                             wait=wait_exponential(multiplier=INITIAL_DELAY), reraise=True)
    result: T = await retrying(attempt)
    return result


def put_retrying(attempts: int, before_sleep: Callable[[RetryCallState], Any] | None) -> AsyncRetrying:
    """An upload's retries. An attempt returns None when done, else why it failed (retried); when the attempts
    run out, that last reason is the answer. `before_sleep` hears of each retry."""
    return AsyncRetrying(retry=retry_if_result(lambda why: why is not None), stop=stop_after_attempt(attempts),
                         wait=wait_exponential(multiplier=INITIAL_DELAY, max=MAX_DELAY), before_sleep=before_sleep,
                         retry_error_callback=lambda state: state.outcome.result())  # type: ignore[union-attr]
