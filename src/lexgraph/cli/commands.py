"""What the parsers of ``lexgraph``'s subcommands share: :func:`add_command` makes one and ties it to the
function that runs it; :func:`workspace_option` and :func:`device_option` add the options most of them take."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def add_command(sub, name: str, func: Callable[..., int], help: str, description: str) -> argparse.ArgumentParser:
    """The subcommand ``name`` of ``lexgraph`` (``sub``: its subparsers), run by ``func`` (``args`` → the
    exit status); ``help`` is its line in ``lexgraph --help``, ``description`` the head of its own ``--help``."""
    parser = sub.add_parser(name, help=help, description=description)
    parser.set_defaults(func=func)
    return parser


def dense_system_option(parser: argparse.ArgumentParser) -> None:
    """``--system SYSTEM``, required: the dense system the subcommand reads."""
    parser.add_argument(
        "--system", required=True, metavar="SYSTEM", help="a dense system (kind dense in `lexgraph systems`)"
    )


def workspace_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--workspace DIR``, the current directory by default; ``what``: its help, before the default."""
    parser.add_argument("--workspace", default=".", metavar="DIR", help=f"{what} (default: %(default)s)")


def device_option(parser: argparse.ArgumentParser, default: str, what: str) -> None:
    """``--device``, ``default`` by default (``auto``, ``cpu``, ...); ``what``: its help, before the default."""
    parser.add_argument("--device", default=default, help=f"{what} (default: %(default)s)")
