"""Configuration: the LiteLLM-style YAML (`schema`), model routes (`routes`), url forms (`urls`) and the
`litellm_settings` batchyard applies."""
