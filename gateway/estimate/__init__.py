"""A file's cost before it runs (the API's `cost_estimate`, `batchyard run --dry-run`): `tokens` (a line's
input tokens and its output bound) and `cost` (a file's lines checked as the intake checks them, counted and
priced per model). Nothing is sent and no engine starts."""
