"""Named points where a test kills the process (SIGKILL, as a crash would), to check what a restart finds.

`BATCHYARD_CRASH_AT=<name>` in a process's environment makes it kill itself the first time it reaches that
point; unset (always, outside the suite's crash tests), `reached` is one dictionary lookup. The point names a
step between two durable writes, so a test stops exactly there instead of guessing with a timer.
"""

from __future__ import annotations

import os
import signal

ENV = "BATCHYARD_CRASH_AT"


def reached(name: str) -> None:
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["ENV", "reached"]
