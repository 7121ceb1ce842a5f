"""The stages a batch goes through, in order:

`validate` (line checks) -> `plan` (shards, one route each) -> `execute` (the shard runner: claims shards,
runs them on a backend, journals results) -> `merge` (seal a shard, k-way merge) -> `finalizer` (output
files, usage, cost) -> `sweeper` (heartbeats, expiry, the one recovery path). `lifecycle` (expiry,
derived ids) is the batch's rules that every stage may import; the rules about one line (its fields, its
media, its budget, why it stops) are `gateway.lines`, below the backends.

A stage imports only earlier ones; later stages are handed in as callables.
"""
