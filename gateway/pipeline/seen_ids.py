"""The custom_ids a file has shown so far, at bounded memory.

`SeenIds` answers "was this id seen before?" for every line of a file. Up to `spill_after` ids (a file within
OpenAI's 50,000-line limit) they are a set in memory, as fast as a set. Past that they move to a SQLite
database in the process's temp dir (`tempfile.gettempdir()`), keyed by the id's text. A bitmap of the ids'
64-bit hashes spares most new ids the lookup; a set bit only sends the id to the database, whose text
decides, so two ids that share a hash are never taken for a repeat. The file is unlinked as soon as it is
open: nothing is left behind when the checker is closed, collected, or its process killed (the OS frees an
unlinked file with its last descriptor). Memory past the threshold: SQLite's bounded page cache, the bitmap,
and the ids not yet written (one batch).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import tempfile
from collections.abc import Callable

log = logging.getLogger(__name__)

SPILL_AFTER = 50_000  # ids kept in memory before they move to disk: OpenAI's line limit stays in memory
_BATCH = 10_000  # ids written to disk per transaction
_CACHE_KIB = 2048  # SQLite's page cache
_BITS = 1 << 24  # the hash bitmap (2 MiB): about 1 new id in 5 is looked up on disk at 4,000,000 ids


class SeenIds:
    def __init__(self, *, spill_after: int = SPILL_AFTER, hash_id: Callable[[str], int] = hash,
                 directory: str | None = None) -> None:
        """`hash_id`: the bitmap's hash, a 64-bit int (the process's own `hash`: the bitmap lives and dies
        with the process). `directory`: where the database's file is made (default: `tempfile.gettempdir()`)."""
        self._spill_after, self._hash, self._directory = spill_after, hash_id, directory
        self._memory: set[str] = set()  # every id until the spill; after it, those not yet on disk
        self._db: sqlite3.Connection | None = None
        self._bits = bytearray()
        self._spill_failed = False

    @property
    def on_disk(self) -> bool:
        return self._db is not None

    def add(self, custom_id: str) -> bool:
        """Note `custom_id`; True when it was seen before (then nothing changes)."""
        if custom_id in self._memory:
            return True
        db = self._db  # read once: a cancelled plan may close it while its last chunk is checked
        if db is not None:
            bit = self._hash(custom_id) & (_BITS - 1)
            mask = 1 << (bit & 7)
            if self._bits[bit >> 3] & mask:  # a hash seen before: the disk says whether it is this id
                if db.execute("SELECT 1 FROM seen WHERE id = ?", (custom_id,)).fetchone():
                    return True
            else:
                self._bits[bit >> 3] |= mask
        self._memory.add(custom_id)
        if len(self._memory) >= (_BATCH if db is not None else self._spill_after):
            self._write()
        return False

    def _write(self) -> None:
        """Move the ids held in memory to disk (opening the database the first time)."""
        if self._db is None:
            if self._spill_failed:
                return
            try:
                self._db = self._open()
            except (OSError, sqlite3.Error) as exc:  # no room for it: correct answers at the old memory cost
                self._spill_failed = True
                log.warning("custom_ids stay in memory: no temporary database (%s)", exc)
                return
            self._bits = bytearray(_BITS // 8)
            for custom_id in self._memory:
                bit = self._hash(custom_id) & (_BITS - 1)
                self._bits[bit >> 3] |= 1 << (bit & 7)
        with self._db:  # one transaction, in key order: each page is written once per batch
            self._db.executemany("INSERT INTO seen (id) VALUES (?)", zip(sorted(self._memory), strict=True))
        self._memory = set()  # a new set: the old one's table is freed, not kept at its largest

    def _open(self) -> sqlite3.Connection:
        fd, path = tempfile.mkstemp(prefix="batchyard-ids-", suffix=".sqlite3", dir=self._directory)
        os.close(fd)
        try:
            # Checked in one thread at a time, but not always the same one (`asyncio.to_thread`).
            db = sqlite3.connect(path, check_same_thread=False)
            try:
                # No journal file beside it, no fsync: a crash loses only what is lost with the process anyway.
                for pragma in ("journal_mode=OFF", "synchronous=OFF", "locking_mode=EXCLUSIVE",
                               f"cache_size=-{_CACHE_KIB}"):
                    db.execute(f"PRAGMA {pragma}")
                db.execute("CREATE TABLE seen (id TEXT PRIMARY KEY NOT NULL) WITHOUT ROWID")
            except BaseException:
                db.close()
                raise
        finally:
            os.unlink(path)  # the open descriptor keeps it; nothing to clean up after any exit
        return db

    def close(self) -> None:
        """Free the database's disk now (collection frees it too); the ids are forgotten."""
        self._memory = set()
        self._bits = bytearray()
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = None
