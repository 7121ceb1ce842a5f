"""What `batchyard submit` keeps on disk: its state beside the output, the results as they arrive, the end.

While the batch runs, each page of `GET /v1/batches/{id}/results` is appended to the output (and error) file
as it arrives, then the state file beside the output records the batch, the cursor after that page, and the
files' sizes. A rerun after a kill cuts the files back to those sizes and asks from that cursor on, so no
line is written twice and none is lost. When the batch ends, the output (and error) file is replaced, whole,
by the batch's own output and error files, downloaded in input order, as `batchyard run` leaves them.
Memory: one page, and one line of each file.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported when a batch is followed (`submit`), not when the command line is parsed
    from openai import OpenAI

_OUTPUT, _ERROR = b'{"kind":"output",', b'{"kind":"error",'
PAGE = 1000


@dataclass(slots=True)
class State:
    """The state file's content: enough for a rerun to go on where this one stopped."""

    input_sha256: str
    batch_id: str
    cursor: str | None = None
    output_bytes: int = 0
    error_bytes: int = 0


def state_path(output: str) -> Path:
    return Path(f"{output}.batchyard-submit.json")


def load_state(output: str, input_sha256: str) -> State | None:
    """The state of an earlier run of this input into this output, or None (none, or another input's)."""
    try:
        data = json.loads(state_path(output).read_text())
        state = State(**data)
    except (OSError, ValueError, TypeError):
        return None
    return state if state.input_sha256 == input_sha256 else None


def save_state(output: str, state: State) -> None:
    path = state_path(output)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(asdict(state)))
    os.replace(tmp, path)  # whole or not at all: a kill never leaves half a state


class Arrivals:
    """The output (and error) file, appended to as results arrive; cut back to the state's sizes on open."""

    def __init__(self, state: State, output: str, error_file: str | None):
        self.state, self.output, self.error_file = state, output, error_file
        self._out = _reopen(output, state.output_bytes)
        self._err = _reopen(error_file, state.error_bytes) if error_file else None
        self.received = 0

    def page(self, client: OpenAI) -> tuple[bool, str]:
        """Fetch and write one page; (more are recorded already, the batch's status when it was read)."""
        import httpx

        for handle, size in ((self._out, self.state.output_bytes), (self._err, self.state.error_bytes)):
            if handle is not None:  # a page cut short (Ctrl-C) left lines past the state: asked for again
                handle.truncate(size)
                handle.seek(size)
        params: dict[str, Any] = {"limit": PAGE, **({"after": self.state.cursor} if self.state.cursor else {})}
        reply = client.get(f"/batches/{self.state.batch_id}/results", cast_to=httpx.Response,
                           options={"params": params})
        for raw in reply.content.splitlines():
            if raw:
                ok, line = _unmarked(raw)
                (self._out if ok or self._err is None else self._err).write(line + b"\n")
                self.received += 1
        self._out.flush()
        if self._err is not None:
            self._err.flush()
        self.state.cursor = reply.headers["x-next-cursor"]
        self.state.output_bytes = self._out.tell()
        self.state.error_bytes = self._err.tell() if self._err is not None else 0
        save_state(self.output, self.state)  # after the lines: a kill between re-reads them, cut back
        return reply.headers.get("x-has-more") == "true", reply.headers.get("x-batch-status", "")

    def close(self) -> None:
        self._out.close()
        if self._err is not None:
            self._err.close()


def _reopen(path: str, size: int) -> IO[bytes]:
    handle = open(path, "r+b" if os.path.exists(path) else "w+b")  # noqa: SIM115 (closed by Arrivals.close)
    handle.truncate(size)
    handle.seek(size)
    return handle


def _unmarked(raw: bytes) -> tuple[bool, bytes]:
    """(a 2xx reply, the output file's line): the results endpoint's line without its `kind`."""
    for prefix, ok in ((_OUTPUT, True), (_ERROR, False)):
        if raw.startswith(prefix):
            return ok, b"{" + raw[len(prefix):]
    data = json.loads(raw)
    kind = data.pop("kind", "output")
    return kind == "output", json.dumps(data).encode()


def write_final(client: OpenAI, batch: Any, input_path: str, output: str, error_file: str | None) -> tuple[int, int]:
    """Replace the output (and error) file by the batch's own files, in input order: with `error_file`, each
    file as it is; without, the two merged by the input's custom_ids, as `batchyard run` writes them inline.
    Returns (output lines, error lines)."""
    with contextlib.ExitStack() as stack:
        out_lines = stack.enter_context(_file_lines(client, batch.output_file_id))
        err_lines = stack.enter_context(_file_lines(client, batch.error_file_id))
        if error_file is not None:
            return _copy(out_lines, output), _copy(err_lines, error_file)
        return _merged(input_path, out_lines, err_lines, output)


@contextlib.contextmanager
def _file_lines(client: OpenAI, file_id: str | None) -> Iterator[Iterator[bytes]]:
    if file_id is None:
        yield iter(())
        return
    with client.files.with_streaming_response.content(file_id) as reply:
        yield (line for line in _lines(reply.iter_bytes()) if line.strip())


def _lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    rest = b""
    for chunk in chunks:
        rest += chunk
        *whole, rest = rest.split(b"\n")
        yield from whole
    if rest:
        yield rest


def _copy(lines: Iterator[bytes], dest: str) -> int:
    count = 0
    tmp = f"{dest}.batchyard-tmp"
    with open(tmp, "wb") as out:
        for line in lines:
            out.write(line + b"\n")
            count += 1
    os.replace(tmp, dest)
    return count


def _merged(input_path: str, out_lines: Iterator[bytes], err_lines: Iterator[bytes], dest: str) -> tuple[int, int]:
    """Both files are in input order: walk the input's custom_ids and take each line from the file whose next
    line answers it (a custom_id answered by neither is skipped; the rest is appended as it comes)."""
    heads: list[bytes | None] = [next(out_lines, None), next(err_lines, None)]
    streams = [out_lines, err_lines]
    counts = [0, 0]
    tmp = f"{dest}.batchyard-tmp"
    with open(tmp, "wb") as out, open(input_path, "rb") as source:
        for raw in source:
            if not raw.strip():
                continue
            try:
                custom_id = json.loads(raw).get("custom_id")
            except (ValueError, AttributeError):
                continue
            for i in (0, 1):
                head = heads[i]
                if head is not None and json.loads(head).get("custom_id") == custom_id:
                    out.write(head + b"\n")
                    counts[i] += 1
                    heads[i] = next(streams[i], None)
                    break
        for i in (0, 1):  # lines whose custom_id the walk did not meet (none, for a file the gateway accepted)
            while heads[i] is not None:
                out.write(heads[i] + b"\n")  # type: ignore[operator]
                counts[i] += 1
                heads[i] = next(streams[i], None)
    os.replace(tmp, dest)
    return counts[0], counts[1]


__all__ = ["Arrivals", "State", "load_state", "save_state", "state_path", "write_final"]
