"""Where requests run: the `Backend` interface and its optional hooks (`interface`), and one shard's
requests through a backend's fair, paced request slots (`bounded`). The implementations live outside the
core: `local_engine` (vLLM in process) and `providers` (LiteLLM real time, native provider batches); the
composition root starts one per route (`gateway.runtime.pool`)."""
