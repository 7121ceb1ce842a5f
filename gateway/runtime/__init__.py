"""gateway.runtime.runtime."""
