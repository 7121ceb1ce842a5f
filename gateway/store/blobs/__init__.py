"""gateway.store.blobs."""
