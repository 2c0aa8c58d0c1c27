"""Every command says what it is for in one line and shows one example that parses."""

from __future__ import annotations

import argparse
import re
import shlex
from importlib.metadata import version

import pytest

from stream.cli.main import build_parser, main


def commands() -> dict[str, argparse.ArgumentParser]:
    [subparsers] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(subparsers.choices)


def summaries() -> dict[str, str | None]:
    [subparsers] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return {action.dest: action.help for action in subparsers._choices_actions}


def test_there_are_commands_to_check() -> None:
    assert {"replay", "report", "tail", "worker", "init-kafka"} <= set(commands())


@pytest.mark.parametrize("name", sorted(commands()))
def test_a_command_says_what_it_is_for_and_shows_an_example(name: str) -> None:
    parser = commands()[name]
    summary = summaries()[name]
    assert summary and "\n" not in summary, f"{name}: no one-line summary in `faultstream --help`"
    assert parser.description and "\n" not in parser.description, f"{name}: no one-line description"
    help_text = parser.format_help()
    assert f"example:\n  faultstream {name}" in help_text, f"{name}: no example in its --help"
    example = parser.epilog.split("example:\n", 1)[1].strip()
    args = build_parser().parse_args(shlex.split(example)[1:])  # the example is a valid command line
    assert args.command == name


def test_the_top_level_help_lists_every_command_with_its_summary(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "example:\n  faultstream replay examples/" in out
    for name in commands():
        assert re.search(rf"^    {name}(\s|$)", out, re.MULTILINE), name


def test_version_is_the_installed_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"faultstream {version('faultstream')}\n"
