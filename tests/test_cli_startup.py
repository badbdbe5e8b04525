"""The ``lexgraph`` command starts fast and explains itself (issue 25, "the first hour"):
``--help`` loads no machine-learning library, and every option of every subcommand has a
help string that shows its default."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT

HEAVY = ("torch", "transformers", "polars")


def test_importing_the_cli_loads_no_heavy_library():
    """``lexgraph --help`` took 6 s, ``lexgraph search --help`` 7.6 s: importing
    ``lexgraph.cli.main`` imported torch, transformers and polars (through the registry of
    systems) before argparse could answer. That import is the cause, so the test checks it
    rather than a wall time (which would be flaky on a loaded machine): in a fresh
    interpreter, ``import lexgraph.cli.main`` and building its parser leave none of them in
    ``sys.modules``; a command imports what it needs when it runs."""
    script = (
        "import sys\nimport lexgraph.cli.main\nlexgraph.cli.main.build_parser()\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"importing lexgraph.cli.main imports {done.stdout.strip()}"


def test_help_answers_without_a_traceback():
    for args in ([], ["search"], ["regress"]):
        done = subprocess.run(
            [sys.executable, "-m", "lexgraph.cli", *args, "--help"],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
            timeout=300,
        )
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert done.stdout.startswith("usage: lexgraph"), done.stdout


def _subcommands() -> dict:
    import argparse

    from lexgraph.cli.main import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {"lexgraph": parser, **sub.choices}


def _expanded_help(parser, action) -> str:
    """``action``'s help as ``--help`` prints it (argparse's own ``%`` expansion), on one line."""
    return " ".join((action.help % dict(vars(action), prog=parser.prog)).split())


def test_every_option_has_a_help_string_showing_its_default():
    """``regress --help`` left --expected and --metrics-dir undescribed, ``search --help`` did not
    say that --system defaults to bm25: each option of each subcommand says what it is and,
    when it has a default (not a flag's False, not None), shows it as ``(default: X)``."""
    import argparse

    undescribed, no_default = [], []
    for name, parser in _subcommands().items():
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            label = f"{name} {'/'.join(action.option_strings) or action.dest}"
            if not action.help or not action.help.strip():
                undescribed.append(label)
            elif action.default not in (
                None,
                False,
                argparse.SUPPRESS,
            ) and f"(default: {action.default})" not in _expanded_help(parser, action):
                no_default.append(label)
    assert not undescribed, f"options without a help string: {undescribed}"
    assert not no_default, f"options whose help does not show their default: {no_default}"


def test_lexgraph_systems_lists_every_system_of_the_registry(capsys):
    """The systems come from the one registry (:func:`lexgraph.methods.catalog.systems`, built from each
    system's own declaration): ``lexgraph systems`` prints one line per system, in its order, with its
    kind and building stage; ``--system``'s help points there (the top-level description once named
    five of eleven)."""
    import re

    from lexgraph.cli.main import main
    from lexgraph.methods.catalog import systems

    assert main(["systems"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(systems())
    for line, spec in zip(lines, systems().values()):
        assert line.split()[1:3] == [spec.kind, spec.stage] and line.endswith(spec.summary)
    parsers = _subcommands()
    (system,) = [a for a in parsers["search"]._actions if "--system" in a.option_strings]
    assert "lexgraph systems" in _expanded_help(parsers["search"], system)
    assert "lexgraph systems" in " ".join(re.findall(r"\S+", parsers["lexgraph"].format_help()))
