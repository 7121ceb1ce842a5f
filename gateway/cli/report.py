"""What `batchyard run` tells the user at the end: the invalid lines, or the summary."""

from __future__ import annotations

from typing import Any

from gateway.cli.console import log_path, say, terminal
from gateway.store.records import BatchRecord

MAX_ERRORS_SHOWN = 20


def report_invalid(batch: BatchRecord) -> None:
    out = terminal()
    say(f"the input file is invalid; nothing was sent ({len(batch.errors)} problem(s) listed):")
    for err in batch.errors[:MAX_ERRORS_SHOWN]:
        where = f"line {err['line']}" if err.get("line") is not None else "file"
        print(f"  {where}: {err['code']}: {err['message']}", file=out)
    if len(batch.errors) > MAX_ERRORS_SHOWN:
        print(f"  … and {len(batch.errors) - MAX_ERRORS_SHOWN} more", file=out)


def summarise(batch: BatchRecord, seconds: float, engine_seconds: float | None) -> None:
    """Counts by model and status, then by route (tokens, cost), native upstream ids, token totals, the log."""
    out = terminal()
    summary = batch.summary or {}
    total = batch.counts.total
    usage = summary.get("usage", {})
    say(f"{total} requests in {seconds:.1f}s: {summary.get('succeeded', 0)} succeeded, "
        f"{summary.get('failed', 0)} failed")
    by_model: dict[str, dict[str, int]] = summary.get("by_model", {})
    statuses = sorted({s for counts in by_model.values() for s in counts})
    if by_model:
        width = max(len(m) for m in by_model) + 2
        widths = [max(10, len(s) + 2) for s in statuses]  # codes like upstream_unreachable are long
        print("  " + "model".ljust(width) + "".join(s.rjust(w) for s, w in zip(statuses, widths, strict=True)),
              file=out)
        for model, counts in sorted(by_model.items()):
            cells = "".join(str(counts.get(s, "")).rjust(w) for s, w in zip(statuses, widths, strict=True))
            print("  " + model.ljust(width) + cells, file=out)
    _routes(batch.routes, out)
    print("  " + throughput(total, usage.get("output_tokens", 0), seconds, engine_seconds), file=out)
    print(f"  tokens: input {usage.get('input_tokens', 0)}, output {usage.get('output_tokens', 0)}, "
          f"total {usage.get('total_tokens', 0)}", file=out)
    where = log_path()
    if where is not None:
        print(f"  log: {where}", file=out)


def _rate(count: float, seconds: float) -> str:
    rate = count / seconds
    # Three significant figures or so: 0.333 req/s for a 10-line demo, not "0 req/s".
    return f"{rate:.0f}" if rate >= 100 else f"{rate:.1f}" if rate >= 10 else f"{rate:.2f}" if rate >= 0.01 \
        else f"{rate:.2g}"


def throughput(requests: int, output_tokens: int, seconds: float, engine_seconds: float | None) -> str:
    """Rates over the time requests were running: a local engine's start-up is reported apart, not averaged in."""
    running = seconds - (engine_seconds or 0.0)
    start = f"; local engines ready in {engine_seconds:.1f}s before that" if engine_seconds is not None else ""
    if running <= 0 or requests == 0:
        return f"throughput: nothing ran{start}"
    rates = f"{_rate(requests, running)} req/s"
    if output_tokens:
        rates += f", {_rate(output_tokens, running)} output tokens/s"
    return f"throughput: {rates} over {running:.1f}s of running{start}"


def _routes(routes: dict[str, dict[str, Any]], out: Any) -> None:
    priced = {n: r for n, r in routes.items() if "requests" in r}
    if priced:
        width = max(len(m) for m in priced) + 2
        print("  " + "route".ljust(width) + "requests".rjust(10) + "tokens in".rjust(12) + "tokens out".rjust(12)
              + "cost USD".rjust(12), file=out)
        for name, r in sorted(priced.items()):
            cost = f"{r['cost_usd']:.6f}" if r.get("cost_usd") else "-"
            print("  " + name.ljust(width) + str(r["requests"]).rjust(10) + str(r["input_tokens"]).rjust(12)
                  + str(r["output_tokens"]).rjust(12) + cost.rjust(12), file=out)
    for name, r in sorted(priced.items()):
        if r.get("reruns") or r.get("output_invalid"):  # replies checked against their schema (docs/output-check.md)
            print(f"  {name}: {r.get('reruns', 0)} re-runs of replies that did not match their schema, "
                  f"{r.get('output_invalid', 0)} still invalid (output_invalid)", file=out)
    for name, route in sorted(routes.items()):
        if isinstance(route, dict) and route.get("upstream_batch_ids"):
            native_cost = route.get("cost_usd")
            print(f"  {name}: native, upstream batches {', '.join(route['upstream_batch_ids'])}"
                  + (f", cost ${native_cost:.6f} at batch rates" if native_cost is not None else ""), file=out)


__all__ = ["MAX_ERRORS_SHOWN", "report_invalid", "summarise", "throughput"]
