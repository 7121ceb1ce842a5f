"""What a large body is read and written with, part by part.

- `dumps_checked` writes what `dumps` writes, refuses a value nested past its bound (counted as
  `loads_checked` counts it), and keeps an integer past 64 bits exact.
- `loads` and `loads_checked` read an integer of 20 digits or more exactly wherever it lies, in a large
  request read in place (a memoryview) across the pieces it is looked at in too; 19 digits are orjson's.
- `read_line_runs` gives a blob's lines, a run per chunk read, exactly as `read_lines` gives them one by
  one: a line that spans chunks whole, empty lines kept, a last line without its `\\n` too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.json_codec import dumps, dumps_checked, loads, loads_checked
from gateway.store.blobs.directory import LocalBlobs
from gateway.store.splitter import read_line_runs, read_lines


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


@pytest.mark.parametrize("value", [
    {"custom_id": "a", "body": {"messages": [{"role": "user", "content": "[{not brackets}]" * 50}]}},
    nested(40),
    {"big": 2**70, "list": [1, 2, 3]},
])
def test_dumps_checked_writes_what_dumps_writes(value: Any) -> None:
    written = dumps_checked(value, 40)
    assert written == dumps(value)
    assert loads(written) == value  # 2**70 too: read back exactly


def test_dumps_checked_refuses_past_its_bound_as_loads_checked_does() -> None:
    at_bound, past = nested(40), nested(41)
    assert loads_checked(dumps_checked(at_bound, 40), 40) == at_bound
    with pytest.raises(ValueError, match="nested more than 40 levels deep"):
        dumps_checked(past, 40)
    with pytest.raises(ValueError, match="nested more than 40 levels deep"):
        loads_checked(dumps(past), 40)
    with pytest.raises(ValueError, match="nested more than 200 levels deep"):
        dumps_checked(nested(300), 200)  # past orjson's writer too: refused, never a RecursionError


def test_loads_checked_without_a_bound_reads_any_depth_orjson_reads() -> None:
    assert loads_checked(dumps(nested(500)), None) == nested(500)


@pytest.mark.parametrize("pad", [0, 1, (1 << 20) - 40, (1 << 20) - 30, (1 << 20) - 20, (1 << 20) - 10])
def test_long_integers_are_read_exactly_wherever_they_lie(pad: int) -> None:
    big = 12345678901234567890123  # 23 digits: orjson would read it as a float
    text = b'{"pad":"' + b" " * pad + b'","n":' + str(big).encode() + b"}"
    assert loads(text)["n"] == big
    assert loads_checked(text, None)["n"] == big
    with memoryview(text) as view:
        assert loads_checked(view, None)["n"] == big  # across the pieces a memoryview is looked at in too
    assert loads(b'{"n":1234567890123456789}')["n"] == 1234567890123456789  # 19 digits: within 64 bits


@pytest.mark.parametrize("content", [
    b"a\nb\n\nc\n",
    b"no line end at the end",
    b"x" * 200_000 + b"\n" + b"short\n" + b"y" * 70_000,  # lines that span the 64 KiB chunks
    b"\n\n",
    b"",
])
async def test_line_runs_are_the_lines_read_lines_gives(tmp_path: Path, content: bytes) -> None:
    blobs = LocalBlobs(tmp_path / "blobs")
    async with blobs.writing("k") as w:
        await w.write(content)
    runs = [run async for run in read_line_runs(blobs, "k")]
    one_by_one = [line async for line in read_lines(blobs, "k")]
    assert [line for run in runs for line in run] == one_by_one
    assert b"\n".join(one_by_one) == content.removesuffix(b"\n")
