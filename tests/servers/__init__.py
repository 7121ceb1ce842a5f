"""tests.servers."""
