"""The teams' file storage: the `storage` part of the `Store` (both modes keep it beside the file records).

What counts: the bytes of every file stored for a team, whatever door made it: its uploads (`POST /files`,
from the moment the upload starts), a Message Batch's input (kept out of the files list, `storage_team`), a
retry's input, and every batch's output and error files (counted once written; they are never refused, the
run being done, but the next upload or create is). Each counts until the file is deleted (by the team, or
by the sweep once it expires).
Files stored by a version without this ledger are not counted (nothing recorded their bytes here).

An upload holds its running size as it streams (`StorageMeter`): each check sets the file's entry to the
bytes seen so far if the team's other entries plus those bytes fit its limit, in one atomic step (a SQL
transaction, a Redis script); a refused check drops the file's entry in that same step. So of two
uploads that together pass the limit exactly one is refused, and a refusal never comes from bytes that
are not there. An entry is `pending` (with the time of its last check) while its upload runs and while
its file is being deleted; `settle` marks it stored. A pending entry older than `STALE_SECONDS` whose
file has no record is what a crash left behind (an upload that never finished, a deletion half done):
the next check drops it.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

from gateway.errors import OverQuota
from gateway.store.protocols import StorageLedger

STALE_SECONDS = 3600.0  # a pending entry older than this with no file record was left by a crash
MIN_STEP, MAX_STEP = 64 * 1024, 4 * 1024 * 1024  # bytes streamed between two checks of a running upload


def over_limit(team: str, limit: int, used: int) -> OverQuota:
    """The refusal of an upload that would pass the team's storage limit (429)."""
    return OverQuota(f"File storage limit reached for team {team!r}. Limit: {limit} bytes ({used} bytes stored "
                     "or being uploaded). Delete files, or wait for them to expire, to make room.",
                     code="storage_quota_exceeded")


class StorageMeter:
    """The checks of one upload against its team's storage limit, as its bytes stream through.

    The store is asked every `step` bytes, at once for a chunk past the room the team had free (so an
    upload alone is refused at the first chunk over the limit), and for the full size at the end: what
    concurrent uploads hold is checked together. A refusal drops the upload's entry; any other failure
    must be followed by `release` (the caller's)."""

    def __init__(self, ledger: StorageLedger, team: str, file_id: str, limit: int | None) -> None:
        self.ledger, self.team, self.file_id, self.limit = ledger, team, file_id, limit
        self.step = min(max((limit or 0) // 16, MIN_STEP), MAX_STEP)

    async def metered(self, chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
        """`chunks`, checked; raises `OverQuota` as soon as the running size passes the limit."""
        if self.limit is None:
            async for chunk in chunks:
                yield chunk
            return
        free = self.limit - await self.ledger.used(self.team)
        size = held = 0
        async for chunk in chunks:
            size += len(chunk)
            if size > free or size - held >= self.step:
                await self._check(size)  # past the free room seen so far: the store decides (files may have gone)
                held = size
                if size > free:
                    free = self.limit - await self.ledger.used(self.team) + size
            yield chunk
        await self._check(size)

    async def _check(self, size: int) -> None:
        assert self.limit is not None
        if not await self.ledger.reserve(self.team, self.file_id, size, self.limit):
            raise await self._refused()

    async def _refused(self) -> OverQuota:
        assert self.limit is not None
        await self.ledger.release(self.team, self.file_id)
        return over_limit(self.team, self.limit, await self.ledger.used(self.team))


__all__ = ["MAX_STEP", "MIN_STEP", "STALE_SECONDS", "StorageMeter", "over_limit"]
