"""Every command's and sub-command's ``--help`` prints (argparse formats help text with
``%``, so a setting's help that says "15 %" once broke ``ppokit llm train --help`` and
``ppokit check --help`` with a traceback)."""

import argparse
import importlib

import pytest

from ppokit import cli


def _parsers():
    for name, (module, description) in cli.COMMANDS.items():
        p = cli._Parser(prog=f"ppokit {name}", description=description)
        importlib.import_module(module).add_arguments(p)
        yield from _walk(p, [name])


def _walk(p, path):
    yield " ".join(path), p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for k, sp in a.choices.items():
                yield from _walk(sp, path + [k])


PARSERS = dict(_parsers())


@pytest.mark.parametrize("path", sorted(PARSERS))
def test_help_formats(path):
    text = PARSERS[path].format_help()
    assert text.startswith("usage: ")


def test_every_command_and_llm_sub_command_is_covered():
    assert set(cli.COMMANDS) <= set(PARSERS)
    assert {"llm train", "llm eval", "llm compare", "check"} <= set(PARSERS)


def test_a_percent_in_a_settings_help_is_printed_as_such(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["llm", "train", "--help"])
    assert e.value.code == 0
    assert "at least 15 % of the" in " ".join(capsys.readouterr().out.split())
