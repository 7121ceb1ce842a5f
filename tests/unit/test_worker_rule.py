"""The default worker count (`--workers` not given): one per free core for the upstream routes."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.schema import Config, load_config
from gateway.runtime.supervisor import default_workers

UPSTREAM = "  - model_name: up\n    litellm_params: {model: openai/gpt-4o-mini, api_key: k, api_base: 'http://127.0.0.1:9/v1'}\n"
LOCAL = "  - model_name: tiny\n    litellm_params: {model: vllm/%s}\n"


def config(tmp_path: Path, upstream: bool, local: int) -> Config:
    text = "model_list:\n" + (UPSTREAM if upstream else "")
    for i in range(local):
        model = tmp_path / f"model{i}"
        model.mkdir(exist_ok=True)
        text += (LOCAL % model).replace("tiny", f"tiny{i}")
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return load_config(path)


@pytest.mark.parametrize(("upstream", "local", "cores", "load", "run", "serve"), [
    (True, 0, 32, 0.0, 31, 31),   # a quiet 32-core box: every core but this process's
    (True, 0, 32, 8.2, 23, 31),   # eight cores busy already: a run leaves them; a server's layout ignores the load
    (True, 2, 16, 0.0, 13, 13),   # two local engines keep a core each
    (True, 0, 2, 0.0, 1, 1),
    (True, 0, 2, 3.0, 0, 1),      # nothing free: the run's own process does it all; serve never runs shards
    (True, 1, 2, 0.0, 0, 1),      # serve keeps one worker for the engine
    (False, 1, 16, 0.0, 0, 1),    # local only: nothing to share out
])
def test_one_worker_per_free_core(tmp_path: Path, upstream: bool, local: int, cores: int, load: float, run: int,
                                  serve: int) -> None:
    cfg = config(tmp_path, upstream, local)
    assert default_workers(cfg, serving=False, cores=cores, load=load) == run
    assert default_workers(cfg, serving=True, cores=cores, load=load) == serve
