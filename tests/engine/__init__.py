"""tests.engine."""
