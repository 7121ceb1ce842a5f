"""The garbage collector around a batchyard process's start-up: paused while it starts, the start-up heap
frozen once it has started.

Starting a local engine imports torch, transformers and vLLM and builds the
engine's config and serving objects: some 700,000 objects that live as long as
the process. Each full (oldest-generation) collection walks all of them, and
the start-up alone triggers about ten (measured: 11 in a 1,000-line `batchyard
run`, 9 of them while starting, one in the batch phase, one in the engine's
close). `vllm serve` freezes its start-up heap for the same reason
(`vllm.utils.gc_utils.freeze_gc_heap` after the server's start-up); we also
pause collection while starting, which run_batch does not. Objects freed by
reference counting (nearly all a request makes) are freed as always; only the
cycle collector skips what is frozen.

Only for a process of its own (`batchyard run` as a command): frozen objects
are never collected, which a test that runs the command in its own process
must not inherit.
"""

from __future__ import annotations

import gc


class StartupHeap:
    """`pause()` when the process starts, `freeze()` once it has started, `resume()` when it ends either way."""

    def __init__(self) -> None:
        self._paused = False
        self._frozen = False

    def pause(self) -> None:
        """No cycle collection while starting: what start-up builds lives as long as the process."""
        if not self._frozen and gc.isenabled():
            gc.disable()
            self._paused = True

    def resume(self) -> None:
        """Collect again as usual (a start-up that ended before `freeze`, e.g. on a bad input file)."""
        if self._paused:
            gc.enable()
            self._paused = False

    def freeze(self) -> None:
        """Collect start-up's garbage once, move every survivor out of the collector's sight, collect again."""
        if self._frozen:
            return
        self._frozen = True
        gc.collect()
        gc.freeze()
        self.resume()


__all__ = ["StartupHeap"]
