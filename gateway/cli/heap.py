"""The garbage collector around a batchyard process's start-up: no full collections while it starts, the
start-up heap frozen once it has started.

Starting a local engine imports torch, transformers and vLLM and builds the
engine's config and serving objects: some 700,000 objects that live as long as
the process. Each full (oldest-generation) collection walks all of them, and
the start-up alone triggers about ten (measured: 11 in a 1,000-line `batchyard
run`, 9 of them while starting, one in the batch phase, one in the engine's
close). In the batch phase such a pause also stalls the event loop that keeps
the engine's submission window full. `vllm serve` freezes its start-up heap for
the same reason (`vllm.utils.gc_utils.freeze_gc_heap` after the server's
start-up); we also defer full collections while starting, which run_batch does
not. The young generations are still collected throughout (a short-lived cycle
is freed as ever), and objects freed by reference counting (nearly all a
request makes) are freed as always; only the cycle collector skips what is
frozen.

The freeze collects the young generations only: a full collection there (some
0.3 s on a quiet 2-core machine) would sit between the engine's start and the
first request; the few old cycles start-up left behind are kept until the
process ends, which is when the run ends.

The API process (`serve`) and each `worker` freeze theirs too, once started:
LiteLLM's import alone leaves some 280,000 objects, and each full collection
under load walked them all (a Message Batch's create body read in the API
process: 0.28 s for 20,000 requests, 0.12 s frozen).

`batchyard run` freezes once its runtime has started (its engines, LiteLLM's import and Router): frozen
before that, as it was, LiteLLM's import came after the freeze and each full collection of a 20,000-line
upstream run walked its 300,000 objects, 19 of them for 2.5 s of a 21 s run; frozen after, 0.3 s (measured).

Only for a process of its own (`batchyard run`, `serve`, `worker` as commands):
frozen objects are never collected, which a process that only calls the command
as a function (a test) must not inherit.
"""

from __future__ import annotations

import gc

# An oldest-generation threshold no start-up reaches: full collections wait for `freeze`.
_NO_FULL_COLLECTION = 1 << 30


class StartupHeap:
    """`pause()` when the process starts, `freeze()` once it has started, `resume()` when it ends either way."""

    def __init__(self) -> None:
        self._thresholds: tuple[int, int, int] | None = None
        self._frozen = False

    def pause(self) -> None:
        """No full collection while starting: what start-up builds lives as long as the process."""
        if self._frozen or self._thresholds is not None:
            return
        self._thresholds = gc.get_threshold()
        young, middle, _ = self._thresholds
        gc.set_threshold(young, middle, _NO_FULL_COLLECTION)

    def resume(self) -> None:
        """The thresholds `pause` kept, back (also for a start-up that ended before `freeze`, e.g. on a bad input
        file): the running process collects at Python's own pace."""
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)
            self._thresholds = None

    def freeze(self) -> None:
        """Move every object start-up made out of the collector's sight (they live as long as the process), then
        `resume`."""
        if self._frozen:
            return
        self._frozen = True
        gc.collect(1)  # the young generations: what is garbage there is not frozen
        gc.freeze()
        self.resume()


__all__ = ["StartupHeap"]
