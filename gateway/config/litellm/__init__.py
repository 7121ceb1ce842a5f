"""LiteLLM compatibility: the config file read as LiteLLM's proxy reads it, and LiteLLM's own names.

`litellm_file` (the file as LiteLLM's proxy reads it: `include`, `environment_variables`), `litellm_settings`
(the `litellm_settings` keys batchyard applies, and their checks), `notices` (LiteLLM's settings batchyard
names but does not apply, and the did-you-mean of an unknown key), and the names generated from the pinned
LiteLLM by scripts/gen_litellm_names.py: `proxy_names` (the keys of each section of its proxy config) and
`litellm_names` (every keyword LiteLLM reads for itself)."""
