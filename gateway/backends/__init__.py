"""Where requests run: the `Backend` interface and its optional hooks (`base`), and the pool that starts
one backend per route (`pool`). The implementations live outside the core: `local_engine` (vLLM in
process) and `providers` (LiteLLM real time, native provider batches)."""
