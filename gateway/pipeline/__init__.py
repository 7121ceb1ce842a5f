"""The stages a batch goes through, in order:

`batch_params` and `lifecycle` (the create's fields; expiry, derived ids: the batch's rules every stage may
import) -> `validate` (line checks) -> `plan` (shards, one route each) -> `batch_service` (the intake,
`BatchService`: upload, create, admit, validate and plan, enqueue, cancel) and `message_batch_create`
(Anthropic's door onto it) -> `merge` (seal a shard, k-way merge) -> `shard_runner` (`ShardRunner`: claims
shards, runs them on a backend, journals results) -> `finalizer` (output files, usage, cost) -> `sweeper`
(`Sweeper`: heartbeats, expiry, the one recovery path). The rules about one line (its fields, its media, its
budget, why it stops) are `gateway.lines`, below the backends; the cost estimate is `gateway.estimate`, and
what is asked after a batch's end `gateway.finished`.

A stage imports only earlier ones; later stages are handed in as callables.
"""
