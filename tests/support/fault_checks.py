"""What every fault test checks once the fault has cleared, as a user and an operator would:
every line answered exactly once and none failed by the fault, no traceback in any log, and the
`/metrics` lines that say why the batch waited."""

from __future__ import annotations

import re
from pathlib import Path

from openai import OpenAI

from tests.support.server_helpers import Gateway, read_jsonl


def assert_every_line_once(client: OpenAI, batch_id: str, custom_ids: list[str]) -> None:
    """The batch completed; each custom_id is in the output once, and no line failed."""
    batch = client.batches.retrieve(batch_id)
    assert batch.status == "completed", batch
    out = [r["custom_id"] for r in read_jsonl(client, batch.output_file_id)]
    errors = read_jsonl(client, batch.error_file_id)
    assert errors == [], errors[:3]
    assert sorted(out) == sorted(custom_ids), (len(out), len(set(out)), len(custom_ids))
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (len(custom_ids), 0)


def logs(gw: Gateway) -> str:
    """The server's own log and every worker's (`logs/` under the data directory)."""
    texts = [gw.log()]
    texts += [p.read_text(errors="replace") for p in sorted((gw.data_dir / "logs").glob("*.log"))]
    return "\n".join(texts)


def log_tail(gw: Gateway, chars: int = 4000) -> str:
    """The end of the logs without the access lines: what a failed wait shows."""
    return "\n".join(line for line in logs(gw).splitlines() if "batchyard.access" not in line)[-chars:]


def assert_no_traceback(gw: Gateway) -> None:
    text = logs(gw)
    assert "Traceback" not in text, text[text.index("Traceback") - 2000:][:6000]


def metric(gw: Gateway, name: str, **labels: str) -> float:
    """One sample of the server's `/metrics` (0 when absent)."""
    text = gw.http("GET", "/metrics").text
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.fullmatch(rf"{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)", line)
        if match and ",".join(sorted((match.group(1) or "").split(","))) == wanted:
            return float(match.group(2))
    return 0.0


def lines_of(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines()


__all__ = ["assert_every_line_once", "assert_no_traceback", "lines_of", "log_tail", "logs", "metric"]
