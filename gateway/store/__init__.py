"""Storage: the `Store`, `Blobs` and `Queue` interfaces and their implementations."""

from gateway.store.base import (
    BatchOptions,
    BatchRecord,
    Blobs,
    Delivery,
    FileRecord,
    Page,
    Queue,
    RequestCounts,
    Store,
    read_lines,
    write_lines,
)

__all__ = [
    "BatchOptions",
    "BatchRecord",
    "Blobs",
    "Delivery",
    "FileRecord",
    "Page",
    "Queue",
    "RequestCounts",
    "Store",
    "read_lines",
    "write_lines",
]
