"""Configuration: the LiteLLM-style YAML read into strict pydantic models.

`schema` (load, `Config`), `entries` (a model_list entry: local, upstream, native), `sections`
(batch_settings and its teams, general_settings, router_settings), `engine_fields` (vLLM's option
names, for engine_args), `problems` (pydantic's errors as file + dotted key), `litellm_settings`,
`routes` (where a model name goes), `wildcards` (how a line's model resolves: alias, exact name, wildcard
pattern), `route_checks` (aliases and fallbacks checked at load) and `urls` (a line's url forms);
`litellm_file` (the file as LiteLLM's proxy reads it: `include`, `environment_variables`), `notices`
(LiteLLM's settings batchyard names but does not apply, and the did-you-mean of an unknown key),
`proxy_names` (generated: the keys of each section of LiteLLM's proxy config)."""
