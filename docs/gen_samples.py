"""Regenerate the sample outputs of ``lexgraph search`` that the README and the docs show.

    .venv/bin/python docs/gen_samples.py                  # rewrite the stale samples in place
    .venv/bin/python docs/gen_samples.py --check          # exit 1 naming each stale page
    .venv/bin/python docs/gen_samples.py --workspace DIR  # run the commands on DIR's artefacts

A sample is a fenced code block (three backticks, no language) of README.md or docs/*.md whose
first line is ``$ lexgraph search ...``: the rest of the block is what that command prints,
run here on the workspace's artefacts (``models/bm25`` and ``data/clean``, written by ``dvc
repro``), never text typed by hand. With ``--json`` each line of output is indented as in
:func:`indent_json` (the same JSON, only spread over lines). Samples use ``--system bm25``:
the cheapest system, and one that loads no neural model.

``tests/test_docs.py`` compares every sample with a fresh run when the workspace has those
artefacts (a clean clone has them only after ``dvc repro``); after a change to what
``lexgraph search`` prints or to the BM25 index, rerun this script and commit the pages.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
from pathlib import Path

from lexgraph.cli.main import build_parser
from lexgraph.cli.main import main as lexgraph
from lexgraph.core import layout

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "$ lexgraph search "
#: a sample block: the fence, the command line, the output up to the closing fence
BLOCK = re.compile(r"^```\n(\$ lexgraph search [^\n]*)\n(.*?)^```$", re.M | re.S)
#: what the samples read from the workspace (every one uses BM25)
NEEDS = (layout.CLEAN.path / "articles.parquet", layout.BM25.path)


def pages(root: Path = ROOT) -> list[Path]:
    """The pages whose samples are generated: README.md and every page of docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def missing(workspace: Path) -> list[str]:
    """The artefacts the samples need that ``workspace`` lacks (``dvc repro`` writes them)."""
    return [str(path) for path in NEEDS if not (workspace / path).exists()]


#: a list of strings longer than this on one line gets one item per line
WIDTH = 100


def _field(key: str, value, column: int = 0) -> str:
    """``"key": value``; a long list of strings (a heading path) one item per line, aligned
    under its first item (``column``: where the field starts)."""
    name, dump = json.dumps(key), json.dumps(value, ensure_ascii=False)
    if len(dump) > WIDTH and isinstance(value, list) and all(isinstance(v, str) for v in value):
        sep = ",\n" + " " * (column + len(name) + len(": ["))
        dump = "[" + sep.join(json.dumps(v, ensure_ascii=False) for v in value) + "]"
    return f"{name}: {dump}"


def indent_json(line: str) -> str:
    """One ``--json`` line spread over lines for reading: the question's fields on the first
    line, then each hit with its rank, id and article on one line and every other field on
    its own. ``json.loads`` of the result equals that of ``line``."""
    record = json.loads(line)
    hits = record.pop("hits")
    pad = " " * len(' "hits": [')
    blocks = []
    for hit in hits:
        fields = [_field(key, value, len(pad) + 1) for key, value in hit.items()]
        lines = ["{" + ", ".join(fields[:3]), *(f"{pad} {field}" for field in fields[3:])]
        blocks.append(",\n".join(lines) + "}")
    head = ", ".join(_field(key, value) for key, value in record.items())
    return "{" + head + ",\n" + ' "hits": [' + f",\n{pad}".join(blocks) + "]}"


def run_sample(command: str, workspace: Path) -> str:
    """What ``command`` (``$ lexgraph search ...``, one question, BM25) prints on
    ``workspace``'s artefacts."""
    argv = shlex.split(command.removeprefix("$ lexgraph "))
    args = build_parser().parse_args(argv)
    if args.system != "bm25" or not args.question or args.questions or "--workspace" in argv:
        raise ValueError(f"{command!r}: a sample asks `lexgraph search --system bm25` one question")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = lexgraph([*argv, "--workspace", str(workspace)])
    if code != 0:
        raise RuntimeError(f"{command!r} exited with status {code} on {workspace}")
    text = out.getvalue()
    if args.json:
        text = "".join(indent_json(line) + "\n" for line in text.splitlines())
    return text


def render(text: str, workspace: Path) -> str:
    """``text`` (a page) with each sample block's output replaced by a fresh run's."""
    return BLOCK.sub(lambda m: f"```\n{m.group(1)}\n{run_sample(m.group(1), workspace)}```", text)


def stale(root: Path = ROOT, workspace: Path = ROOT) -> dict[Path, str]:
    """``{page: regenerated text}`` of every page whose samples differ from a fresh run."""
    changed = {}
    for page in pages(root):
        text = page.read_text(encoding="utf-8")
        fresh = render(text, workspace)
        if fresh != text:
            changed[page] = fresh
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", type=Path, default=ROOT, help="where `dvc repro` wrote models/ and data/")
    parser.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 if a sample is stale")
    args = parser.parse_args(argv)
    absent = missing(args.workspace)
    if absent:
        parser.error(f"{args.workspace} lacks {', '.join(absent)}: run `dvc repro` first")
    changed = stale(ROOT, args.workspace)
    for page, text in changed.items():
        if args.check:
            print(f"stale: {page.relative_to(ROOT)}")
        else:
            page.write_text(text, encoding="utf-8", newline="\n")
            print(f"rewrote {page.relative_to(ROOT)}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
