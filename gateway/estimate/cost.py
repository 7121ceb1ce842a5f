"""What a batch file would cost, before it runs: one streamed pass over its lines, like validation.

Each line is checked as the batch would check it (`LineChecker`, the caller's models); a good line adds to
its route's lines, input tokens and output-token bound, and the route's prices turn those into a cost range.
Nothing is sent and no engine starts. The API's `GET /v1/files/{id}/cost_estimate` and `batchyard run
--dry-run` both ask `estimate_lines`.

- Input tokens and a line's output bound: `gateway.lines.tokens` (each model says whether its tokenizer
  is `exact` or an `estimate`).
- Prices are the ones the route charges (`gateway.config.prices`): the config's or the price map's for an
  upstream route, batch prices for a native one, `model_info` for a local one (else unpriced). With several
  deployments the low end takes the cheapest, the high end the dearest. Low: input only; high: input plus
  the output bound.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from gateway.config.prices import Prices, batch_prices, deployment_prices, route_prices
from gateway.config.routes import Route, RouteKind
from gateway.config.schema import Config
from gateway.domain import BatchRequest, Endpoint
from gateway.errors import LineCode, LineError
from gateway.lines.output_check import wanted
from gateway.lines.tokens import TokenCounter, counter_for, output_bound, price_map, price_names
from gateway.pipeline.plan import OneThread
from gateway.pipeline.validate import LINE_SLACK, LineChecker, LineProblem, chunks, line_failure
from gateway.store.protocols import Blobs
from gateway.store.splitter import Overlong, split_lines


@dataclass(frozen=True, slots=True)
class EstimateJob:
    """What estimating a stored file needs besides the config and the blobs; picklable, for another process."""

    input_key: str
    allowed_models: list[str] | None
    endpoint: Endpoint | None = None


@dataclass(slots=True)
class ModelEstimate:
    model: str
    kind: str
    tokenizer: str  # "exact" or "estimate"
    low: Prices | None  # the cheapest deployment's per-token prices; None: unpriced
    high: Prices | None
    lines: int = 0
    input_tokens: int = 0
    output_tokens_max: int = 0
    unbounded: int = 0  # lines whose output has no known bound
    with_schema: int = 0  # lines whose reply is checked against a schema: each may be re-run, and paid again

    @property
    def output_bound(self) -> int | None:
        return None if self.unbounded else self.output_tokens_max

    def costs(self) -> tuple[float | None, float | None]:
        if self.low is None or self.high is None:
            return None, None
        low = self.input_tokens * self.low.input
        bound = self.output_bound
        return low, None if bound is None else self.input_tokens * self.high.input + bound * self.high.output

    def to_json(self) -> dict[str, Any]:
        low, high = self.costs()
        prices = None if self.low is None or self.high is None else {
            "input_cost_per_token": [self.low.input, self.high.input],
            "output_cost_per_token": [self.low.output, self.high.output]}
        return {"model": self.model, "route": self.kind, "lines": self.lines, "input_tokens": self.input_tokens,
                "tokenizer": self.tokenizer, "output_tokens_max": self.output_bound,
                "lines_without_output_bound": self.unbounded, "lines_with_schema": self.with_schema,
                "prices": prices, "cost_low": _usd(low),
                "cost_high": _usd(high)}


@dataclass(slots=True)
class Estimate:
    models: dict[str, ModelEstimate] = field(default_factory=dict)
    lines: int = 0  # requests read (blank lines left out), the bad ones included
    answered: int = 0  # lines a lenient run answers in place with an error (never sent)
    errors: list[LineError] = field(default_factory=list)  # as the batch would list them, capped
    error_count: int = 0

    def totals(self) -> dict[str, Any]:
        rows = list(self.models.values())
        costs = [m.costs() for m in rows if m.low is not None]
        bounds = [m.output_bound for m in rows]
        return {"lines": sum(m.lines for m in rows), "input_tokens": sum(m.input_tokens for m in rows),
                "output_tokens_max": None if None in bounds else sum(b or 0 for b in bounds),
                "cost_low": _usd(sum(c[0] or 0.0 for c in costs)),
                "cost_high": None if any(c[1] is None for c in costs) else _usd(sum(c[1] or 0.0 for c in costs)),
                "unpriced_models": [m.model for m in rows if m.low is None],
                "lines_with_schema": sum(m.with_schema for m in rows)}

    def to_json(self) -> dict[str, Any]:
        return {"object": "file.cost_estimate", "currency": "USD", "lines": self.lines,
                "models": [m.to_json() for m in self.models.values()], "total": self.totals(),
                "lines_answered_with_errors": self.answered, "error_count": self.error_count,
                "errors": {"object": "list", "data": [e.to_openai() for e in self.errors]}}

    def table(self) -> str:
        """The estimate as a table for a terminal, then the errors."""
        head = ("model", "route", "lines", "input tokens", "tokenizer", "output tokens <=", "cost low USD",
                "cost high USD")
        rows = [head]
        for m in self.models.values():
            low, high = m.costs()
            rows.append((m.model, m.kind, str(m.lines), str(m.input_tokens), m.tokenizer, _shown(m.output_bound),
                         _money(low, m.low is None), _money(high, m.low is None)))
        total = self.totals()
        rows.append(("total", "", str(total["lines"]), str(total["input_tokens"]), "",
                     _shown(total["output_tokens_max"]), _money(total["cost_low"], False),
                     _money(total["cost_high"], False)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        out = ["  ".join(c.ljust(w) if i < 2 or i == 4 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths,
                                                                                                    strict=True)))
               .rstrip() for r in rows]
        if total["unpriced_models"]:
            out.append(f"unpriced (not in the totals): {', '.join(total['unpriced_models'])}")
        if total["lines_with_schema"]:
            out.append(f"{total['lines_with_schema']} line(s) name a schema for their output: a reply that does not "
                       "match is re-run (batch_settings.output_check.reruns), and each re-run adds to the cost")
        if self.answered:
            out.append(f"{self.answered} line(s) would be answered in place with an error (never sent)")
        if self.error_count:
            out.append(f"{self.error_count} line(s) would fail the batch:")
            out += [f"  {e}" for e in self.errors]
            if self.error_count > len(self.errors):
                out.append(f"  … and {self.error_count - len(self.errors)} more")
        return "\n".join(out) + "\n"


def _usd(value: float | None) -> float | None:
    return None if value is None else round(value, 9)


def _shown(value: int | None) -> str:
    return "unknown" if value is None else str(value)


def _money(value: float | None, unpriced: bool) -> str:
    if unpriced or value is None:
        return "unpriced" if unpriced else "unknown"
    return f"{value:.6f}" if value == 0 or value >= 0.001 else f"{value:.3e}"  # a small cost keeps its digits


async def estimate_file(config: Config, blobs: Blobs, job: EstimateJob) -> Estimate:
    """The estimate of a stored file (the API's), streamed from the blobs."""
    cap = config.batch.limits.max_line_bytes + LINE_SLACK
    return await estimate_lines(config, split_lines(blobs.read(job.input_key), cap),
                                allowed_models=job.allowed_models, endpoint=job.endpoint)


async def estimate_lines(
    config: Config, lines: AsyncIterator[bytes | Overlong], *, allowed_models: list[str] | None = None,
    endpoint: Endpoint | None = None, strict: bool = True,
) -> Estimate:
    """The estimate of a stream of lines (cut off at the line limit as they are read: `split_lines`). `strict`:
    a line that can't run fails the batch (the API's); otherwise it is answered in place (`batchyard run`)."""
    estimator = _Estimator(config, allowed_models, endpoint, strict)
    thread = OneThread()
    try:
        async for chunk in chunks(lines):  # the chunks validation checks, one thread hop each
            # The CPU work (JSON, checks, tokenizers) in a thread, so that the caller's loop keeps turning.
            if not await thread.run(estimator.feed, chunk):
                break
        return estimator.finish()
    finally:  # the thread, and the custom_ids' disk, however the estimate ends
        thread.close()
        estimator.close()


class _Estimator:
    def __init__(self, config: Config, allowed: list[str] | None, endpoint: Endpoint | None, strict: bool) -> None:
        self._config, self._strict = config, strict
        self._checker = LineChecker(config, endpoint=endpoint, allowed_models=allowed,
                                    allow_duplicates=config.run_batch_rules)
        self._counters: dict[str, TokenCounter] = {}
        self._number = 0
        self.estimate = Estimate()

    def _fail(self, error: LineError) -> None:
        self.estimate.error_count += 1
        if len(self.estimate.errors) < self._config.batch.limits.max_errors_listed:
            self.estimate.errors.append(error)

    def feed(self, chunk: list[bytes | Overlong]) -> bool:
        """Check and count a chunk of lines; False once the file has more lines than a batch may."""
        for raw in chunk:
            self._number += 1
            try:
                checked = self._checker.check(raw, self._number)
            except Exception:  # as validation: a line the checks did not foresee is that line's error
                checked = LineError(LineCode.INVALID_REQUEST, "This line could not be checked.", self._number)
            if checked is None:
                continue
            self.estimate.lines += 1
            if self.estimate.lines > self._config.batch.limits.max_lines:
                self._fail(LineError(LineCode.TOO_MANY_TASKS,
                                     f"the file has more than {self._config.batch.limits.max_lines} requests",
                                     self._number))
                return False
            if (error := line_failure(checked, self._strict)) is not None:
                self._fail(error)
            elif isinstance(checked, LineProblem):
                self.estimate.answered += 1
            elif isinstance(checked, BatchRequest):
                self._count(checked)
        return True

    def _count(self, req: BatchRequest) -> None:
        route = self._config.route(req.model)
        assert route is not None  # the checker let the line through: its model has a route
        counter = self._counters.get(route.model_name)
        if counter is None:
            counter = self._counters[route.model_name] = counter_for(route)
        row = self.estimate.models.get(route.model_name)
        if row is None:
            low, high = _price_range(route)
            row = self.estimate.models[route.model_name] = ModelEstimate(
                route.model_name, route.kind.value, "exact" if counter.exact else "estimate", low, high)
        tokens = counter.count(req.url, req.body)
        row.lines += 1
        row.with_schema += wanted(req.url, req.body) is not None
        row.input_tokens += tokens
        bound = output_bound(req.url, req.body, tokens, counter.limit)
        if bound is None:
            row.unbounded += 1
        else:
            row.output_tokens_max += bound

    def close(self) -> None:
        self._checker.close()

    def finish(self) -> Estimate:
        if self.estimate.lines == 0 and not self._config.run_batch_rules:
            self._fail(LineError(LineCode.EMPTY_FILE, "the file contains no requests"))
        return self.estimate


def _price_range(route: Route) -> tuple[Prices | None, Prices | None]:
    if route.kind is RouteKind.LOCAL:
        found = [route_prices(route.model_info.litellm_keys)]
    elif route.kind is RouteKind.NATIVE:
        cost = price_map()
        found = [batch_prices(entry.model_info.litellm_keys, cost, names, route.batch_discount(i))
                 for i, (entry, names) in enumerate(zip(route.entries, price_names(route), strict=True))]
    else:
        found = [deployment_prices(d) for d in route.model_list()]
    priced = [p for p in found if p is not None]
    if not priced:
        return None, None
    return (Prices(min(p.input for p in priced), min(p.output for p in priced)),
            Prices(max(p.input for p in priced), max(p.output for p in priced)))

__all__ = ["Estimate", "EstimateJob", "ModelEstimate", "estimate_file", "estimate_lines"]
