"""`--help` (and the CLI reference generated from it, docs/reference/cli.md) says what the code does.

Where a flag's default is a value, the help names that value; where it is a rule (`--workers`), the rule's
words are checked against the function that applies it."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

from gateway.cli.main import build_parser
from gateway.runtime.supervisor import default_workers
from tests.unit.test_worker_rule import config


def _actions(parser: argparse.ArgumentParser, name: str = "batchyard") -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _actions(sub, f"{name} {sub_name}")
        else:
            yield name, action


def _help(command: str, flag: str) -> str:
    for name, action in _actions(build_parser()):
        if name == command and flag in action.option_strings:
            return " ".join((action.help or "").split())
    raise AssertionError(f"{command} has no {flag}")


def test_every_value_default_is_the_one_the_help_names() -> None:
    checked = 0
    for command, action in _actions(build_parser()):
        default = action.default
        if default in (None, argparse.SUPPRESS) or isinstance(default, bool):
            continue  # no value to name (a rule, or a switch that is off)
        # the value ends at ";", ")" or ", " (a comma with no space after it is the value's: `day,route`)
        said = re.search(r"default:? ((?:[^;),]|,(?! ))+)", action.help or "")
        assert said is not None, f"{command} {action.option_strings[0]}: the help names no default ({default!r})"
        named = said.group(1).strip().rstrip(".")
        assert named in (str(default), f"{default:g}" if isinstance(default, float) else str(default)), (
            f"{command} {action.option_strings[0]}: the help says {named!r}, the code's default is {default!r}")
        checked += 1
    assert checked >= 5  # --host, --port, --metrics-host, --completion-window, --poll at least


def test_the_workers_rule_is_the_one_the_help_says(tmp_path: Path) -> None:
    """`serve --workers`: one per free core less the API's and each local model's, at least one, the load
    never read, one with no upstream route; `run --workers`: the load average counts."""
    serve_help, run_help = _help("batchyard serve", "--workers"), _help("batchyard run", "--workers")
    assert "load average is never read" in serve_help and "less one for the API process and one per local model" \
        in serve_help and "at least one" in serve_help and "no upstream route" in serve_help
    assert "load average says are busy" in run_help
    mixed, local_only = config(tmp_path, upstream=True, local=1), config(tmp_path, upstream=False, local=1)
    for load in (0.0, 3.0, 40.0):  # serve's count moves with the cores, never with the load
        assert default_workers(mixed, serving=True, cores=8, load=load) == 8 - 1 - 1
        assert default_workers(mixed, serving=True, cores=2, load=load) == 1
        assert default_workers(local_only, serving=True, cores=8, load=load) == 1
    assert default_workers(mixed, serving=False, cores=8, load=3.0) < default_workers(mixed, serving=False, cores=8,
                                                                                      load=0.0)
