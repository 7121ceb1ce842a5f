"""Configuration: the LiteLLM-style YAML read into strict pydantic models.

`schema` (load, `Config`), `entries` (a model_list entry: local, upstream, native), `sections`
(batch_settings and its teams, general_settings, router_settings), `engine_fields` (vLLM's option
names, for engine_args), `problems` (pydantic's errors as file + dotted key),
`routes` (where a model name goes), `wildcards` (how a line's model resolves: alias, exact name, wildcard
pattern), `route_checks` (aliases and fallbacks checked at load) and `urls` (a line's url forms);
`litellm/` (LiteLLM compatibility: the file as LiteLLM's proxy reads it, `litellm_settings`, the notices of
what batchyard does not apply, and the names generated from the pinned LiteLLM)."""
