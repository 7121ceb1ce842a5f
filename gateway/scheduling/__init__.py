"""gateway.scheduling."""
