"""batchyard: a batch gateway for LLM work.

Offline by default: nothing reaches the network at start unless the config
asks for it. LiteLLM reads its bundled price map instead of downloading one
on import, and vLLM sends no usage statistics. Both are defaults the
environment may override.
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
