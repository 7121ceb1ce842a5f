"""Storage: the `Store` (files, batches, the shard ledger, backend state), `Blobs` and `Queue` interfaces
and their implementations."""

from gateway.store.base import (
    BackendState,
    BatchOptions,
    BatchRecord,
    BatchStore,
    Blobs,
    Delivery,
    FileRecord,
    FileStore,
    Page,
    Queue,
    RequestCounts,
    ShardLedger,
    Store,
    read_lines,
    write_lines,
)

__all__ = [
    "BackendState",
    "BatchOptions",
    "BatchRecord",
    "BatchStore",
    "Blobs",
    "Delivery",
    "FileRecord",
    "FileStore",
    "Page",
    "Queue",
    "RequestCounts",
    "ShardLedger",
    "Store",
    "read_lines",
    "write_lines",
]
