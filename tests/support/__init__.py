"""tests.support."""
