"""A shard's lines whose reply must match a schema: each reply checked as it is recorded, and re-run on the
same route while it does not match and re-runs are left (`OutputReruns`, driven by the shard runner).

The check (`gateway.lines.output_check`) is CPU work: the runner calls `settle` in a thread, on the results it
is about to journal, so it costs no store round trip of its own. A line being re-run is not journaled until
its last attempt: the journal holds one result per line, the first valid attempt's (or the last attempt's,
failed with `output_invalid`), whose `cost_usd` is that of every attempt and whose `reruns` counts the
attempts past the first.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.domain import BatchRequest, Result, billable
from gateway.lines.output_check import OUTPUT_INVALID, Wanted, problem, wanted


class OutputReruns:
    """The checked lines of one shard run, and the attempts each had so far."""

    def __init__(self, requests: Sequence[BatchRequest], reruns: int) -> None:
        self.reruns = reruns
        self._wanted: dict[int, Wanted] = {}
        self._requests: dict[int, BatchRequest] = {}
        same: dict[tuple[object, ...], Wanted] = {}  # one `Wanted` (and schema bytes) per distinct schema, not per line
        for req in requests:
            want = wanted(req.url, req.body)
            if want is not None:
                key = (want.endpoint, want.content, want.schema, want.param, *want.tools.items())
                self._wanted[req.line] = same.setdefault(key, want)
                self._requests[req.line] = req
        self._tries: dict[int, int] = {}  # line -> attempts past the first so far
        self._paid: dict[int, float] = {}  # line -> the cost of its attempts before this one
        self._last: dict[int, Result] = {}  # line -> its invalid reply now being re-run (kept if it stops there)
        self._again: list[BatchRequest] = []

    def __bool__(self) -> bool:
        return bool(self._wanted)

    def settle(self, results: list[Result]) -> list[Result]:
        """The results to journal now; an invalid reply with re-runs left is held back and its request queued
        (`take`). CPU work (the check): callers on an event loop run it in a thread."""
        done: list[Result] = []
        for result in results:
            want = self._wanted.get(result.line)
            if want is None:
                done.append(result)
                continue
            line = result.line
            tries = self._tries.get(line, 0)
            if result.ok:
                found = problem(want, result.body)
                if found is None and not tries:  # the common case: valid at the first attempt
                    done.append(result)
                    continue
                if found is not None:
                    if tries < self.reruns:
                        self._tries[line] = tries + 1
                        self._paid[line] = self._paid.get(line, 0.0) + billable(result.cost_usd)
                        self._last[line] = result
                        self._again.append(self._requests[line])
                        continue
                    _invalid(result, found, tries + 1)
            done.append(self._folded(result, tries))
        return done

    def take(self) -> list[BatchRequest]:
        """The requests to run again, in input order (taken: the next round's)."""
        again, self._again = self._again, []
        again.sort(key=lambda r: r.line)
        return again

    def give_up(self, requests: Sequence[BatchRequest]) -> list[Result]:
        """Results for queued re-runs that will not run (the team's budget is spent): each line's last reply,
        failed with `output_invalid`."""
        done = []
        for req in requests:
            result = self._last.pop(req.line)
            tries = self._tries.get(req.line, 0)
            self._paid[req.line] -= billable(result.cost_usd)  # counted in `_paid` when it was held back
            _invalid(result, problem(self._wanted[req.line], result.body) or "", tries, stopped=True)
            done.append(self._folded(result, tries - 1))
        return done

    def _folded(self, result: Result, tries: int) -> Result:
        """The line's result with what its earlier attempts cost and how many there were."""
        self._last.pop(result.line, None)
        paid = self._paid.pop(result.line, 0.0)
        result.reruns = tries
        if paid:
            result.cost_usd = paid + billable(result.cost_usd)
        return result


def _invalid(result: Result, found: str, attempts: int, *, stopped: bool = False) -> None:
    why = "; no more re-runs (the team's budget is spent)" if stopped else ""
    result.error = {"code": OUTPUT_INVALID,
                    "message": f"The output does not match the request's schema after {attempts} "
                               f"attempt{'s' if attempts != 1 else ''}{why}: {found}"}


__all__ = ["OutputReruns"]
