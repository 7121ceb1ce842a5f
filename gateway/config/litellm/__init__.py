"""LiteLLM compatibility: the config file read as LiteLLM's proxy reads it, and LiteLLM's own names.

`litellm_file` (the file as LiteLLM's proxy reads it: `include`, `environment_variables`), `credentials`
(`credential_list` given to the entries that name it), `litellm_settings` (the `litellm_settings` keys
batchyard applies, and their checks), `notices` (what batchyard does with each LiteLLM key: applied, or named
but not applied, and the did-you-mean of an unknown key), `deployment_keys` (a deployment's `litellm_params`
and `model_info` keys and provider checked; batchyard's own `model_info` keys, one list), and the names
generated from the pinned LiteLLM by scripts/gen_litellm_names.py: `proxy_names` (the keys of each section of
its proxy config, the callbacks the proxy starts), `deployment_names` (what a `model_list` entry may hold, the
providers) and `litellm_names` (every keyword LiteLLM reads for itself)."""
