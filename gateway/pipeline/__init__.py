"""The stages a batch goes through, in order:

`validate` (line checks) -> `plan` (shards, one route each) -> `execute` (the shard runner: claims shards,
runs them on a backend, journals results) -> `merge` (seal a shard, k-way merge) -> `finalizer` (output
files, usage, cost) -> `coordinator` (heartbeats, expiry, the one recovery path). `lifecycle` (stop
reasons, expiry, derived ids) is the batch's rules that every stage may import.

A stage imports only earlier ones; later stages are handed in as callables.
"""
