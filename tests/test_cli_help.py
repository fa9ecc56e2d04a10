"""Every command's and subcommand's ``--help`` renders: argparse formats help texts with
``%``, so a help text that holds a bare ``%`` (``15 % of ...``) broke ``ppokit llm train
--help`` with a TypeError."""

import argparse
import importlib

import pytest

from ppokit.cli import COMMANDS, main


def _parsers(p: argparse.ArgumentParser, name: str):
    yield name, p
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_help_text_renders(command):
    top = argparse.ArgumentParser(prog=f"ppokit {command}")
    importlib.import_module(COMMANDS[command][0]).add_arguments(top)
    for name, p in _parsers(top, command):
        assert p.format_help().startswith("usage:"), name


def test_llm_train_help_prints_a_percentage(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["llm", "train", "--help"])
    assert exc.value.code == 0
    assert "at least 15 % of" in " ".join(capsys.readouterr().out.split())
