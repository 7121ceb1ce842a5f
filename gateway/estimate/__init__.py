"""A file's cost before it runs (the API's `cost_estimate`, `batchyard run --dry-run`): `cost` (a file's lines
checked as the intake checks them, counted and priced per model; a line's tokens by `gateway.lines.tokens`).
Nothing is sent and no engine starts."""
