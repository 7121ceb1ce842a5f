"""A local model's path is read from the config file's directory, whatever the working directory; `config
check` refuses a local path that is not there."""

from __future__ import annotations

import argparse
import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cli.config_check import EXIT_CONFIG, EXIT_OK, check_command
from gateway.config.schema import load_config


@pytest.fixture
def elsewhere(tmp_path: Path) -> Iterator[Path]:
    """A working directory that is not the config's."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    before = os.getcwd()
    os.chdir(cwd)
    try:
        yield cwd
    finally:
        os.chdir(before)


def write_config(folder: Path, model: str, engine_args: str = "{}") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "c.yaml"
    path.write_text(f"model_list:\n  - model_name: tiny\n    litellm_params: {{model: vllm/{model}}}\n"
                    f"    engine_args: {engine_args}\n")
    return path


def engine_model(path: Path) -> str:
    return str(load_config(path).routes["tiny"].engine_args["model"])


def test_a_relative_model_path_is_read_from_the_config_files_directory(tmp_path: Path, elsewhere: Path) -> None:
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    (tmp_path / "models" / "tokenizer").mkdir()
    (tmp_path / "conf" / "template.jinja").parent.mkdir()
    (tmp_path / "conf" / "template.jinja").write_text("{{ messages }}")
    config = write_config(tmp_path / "conf", "../models/tiny",
                          "{tokenizer: ../models/tokenizer, chat_template: template.jinja}")
    route = load_config(config).routes["tiny"]
    assert route.engine_args["model"] == str(tmp_path / "models" / "tiny")
    assert route.engine_args["tokenizer"] == str(tmp_path / "models" / "tokenizer")
    assert route.engine_args["chat_template"] == str(tmp_path / "conf" / "template.jinja")
    # a name that exists next to the config is that directory; from the config given by a relative path too
    (tmp_path / "conf" / "org" / "model").mkdir(parents=True)
    write_config(tmp_path / "conf", "org/model")
    assert engine_model(Path("..") / "conf" / "c.yaml") == str(tmp_path / "conf" / "org" / "model")


def test_a_hub_id_and_an_inline_template_stay_as_written(tmp_path: Path, elsewhere: Path) -> None:
    config = write_config(tmp_path, "meta-llama/Meta-Llama-3-8B-Instruct", "{chat_template: '{{ messages }}'}")
    route = load_config(config).routes["tiny"]
    assert route.engine_args["model"] == "meta-llama/Meta-Llama-3-8B-Instruct"
    assert route.engine_args["chat_template"] == "{{ messages }}"
    assert engine_model(write_config(tmp_path, "gpt2")) == "gpt2"


def test_config_check_refuses_a_local_path_that_is_not_there(tmp_path: Path, elsewhere: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(file=str(write_config(tmp_path / "conf", "../models/tiny")), strict_config=False)
    assert check_command(args, io.StringIO()) == EXIT_CONFIG
    said = capsys.readouterr().err
    assert f"local model path {tmp_path / 'models' / 'tiny'} is not a directory" in said
    assert "read from the config file's directory" in said
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    out = io.StringIO()
    assert check_command(args, out) == EXIT_OK
    assert "tiny" in out.getvalue() and "local" in out.getvalue()
