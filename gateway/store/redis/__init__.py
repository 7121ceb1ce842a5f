"""gateway.store.redis."""
