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
    ``lexgraph.cli`` imported torch, transformers and polars (through the registry of
    systems) before argparse could answer. That import is the cause, so the test checks it
    rather than a wall time (which would be flaky on a loaded machine): in a fresh
    interpreter, ``import lexgraph.cli`` and building its parser leave none of them in
    ``sys.modules``; a command imports what it needs when it runs."""
    script = ("import sys\nimport lexgraph.cli\nlexgraph.cli.build_parser()\n"
              f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"importing lexgraph.cli imports {done.stdout.strip()}"


def test_help_answers_without_a_traceback():
    for args in ([], ["search"], ["regress"]):
        done = subprocess.run([sys.executable, "-m", "lexgraph.cli", *args, "--help"], capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, timeout=300)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert done.stdout.startswith("usage: lexgraph"), done.stdout
