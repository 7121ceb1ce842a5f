"""gateway.store.sqlite."""
