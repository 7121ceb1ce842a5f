"""gateway.runtime.root."""
