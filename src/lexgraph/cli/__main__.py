"""``python -m lexgraph.cli``: the ``lexgraph`` command."""

from lexgraph.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
