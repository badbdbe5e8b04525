"""Benchmark: the server's memory over reloads (issue 40, item 7).

    .venv/bin/python benchmarks/serve_reload.py [--workspace .] [--reloads 10] [--out benchmarks/serve_reload.json]
    .venv/bin/python benchmarks/serve_reload.py --source OLD/src --label before --out ...   # another checkout's code
    .venv/bin/python benchmarks/serve_reload.py --table benchmarks/serve_reload.json

The real command, ``lexgraph serve --workspace . --port 0``, serves a scratch workspace (links to
every entry of the reproduced workspace W, and W's params.yaml with only the ``serve`` keys the code
under test knows), every system of ``serve.systems``. Once it answers, each system is asked one
question (a dense system builds its FAISS index on its first question, the re-ranker loads its PLM),
and the process's resident memory (``VmRSS`` of ``/proc/PID/status``) is read; then ``--reloads``
times: SIGHUP (the reload a user triggers after ``dvc repro``), wait until ``/health`` names the next
generation, ask every system one question again, wait ``--settle`` seconds and read ``VmRSS`` and
``VmHWM`` (the peak). ``--source DIR`` runs the server from another checkout's ``src`` (put first on
``PYTHONPATH``), to measure the code before a change on the same workspace and machine; the result
is merged into ``--out`` under ``--label``. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

from lexgraph.core.errors import LexgraphError

log = logging.getLogger("serve_reload")

QUESTION = "Qui paie la réparation du mur mitoyen ?"
#: the serve keys of the code before issue 40 (an older ServeConfig refuses a key it does not know)
KEYS_BEFORE = (
    "systems",
    "max_batch",
    "max_wait_ms",
    "max_k",
    "page_k",
    "max_question_chars",
    "max_batch_questions",
    "max_body_bytes",
    "max_head_bytes",
    "header_timeout_s",
    "body_timeout_s",
)


def memory(pid: int) -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` of ``pid``, in GB (10^9 bytes)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = round(int(value.split()[0]) * 1024 / 1e9, 2)
    return {"rss_gb": fields["VmRSS"], "peak_gb": fields["VmHWM"]}


def generation(port: int) -> int:
    from serve import fetch  # benchmarks/serve.py, beside this script

    status, body = asyncio.run(fetch(port, "/health"))
    if status != 200:
        raise LexgraphError(f"/health answered {status}: {body[:200]!r}")
    return int(json.loads(body)["generation"])


def ask_every_system(port: int, systems: list[str]) -> None:
    from serve import fetch

    for system in systems:
        status, body = asyncio.run(fetch(port, f"/search?q={quote(QUESTION)}&system={system}&k=10", timeout=300))
        if status != 200:
            raise LexgraphError(f"{system}: /search answered {status}: {body[:200]!r}")


def measure(args, served: Path, systems: list[str]) -> dict:
    from serve import ServerProcess

    env_path = os.environ.get("PYTHONPATH")
    if args.source:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(args.source.resolve()), env_path]))
    try:
        start = time.perf_counter()
        server = ServerProcess(served, "cpu", served.parent / "serve.log", timeout=600)
    finally:
        if env_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = env_path
    try:
        ask_every_system(server.port, systems)
        rows = [{"generation": 0, "seconds": round(time.perf_counter() - start, 1), **memory(server.proc.pid)}]
        log.info("%s: generation 0 %s", args.label, rows[-1])
        for n in range(1, args.reloads + 1):
            start = time.perf_counter()
            server.proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 600
            while generation(server.port) < n:
                if time.monotonic() > deadline or server.proc.poll() is not None:
                    raise LexgraphError(f"reload {n} did not finish: {server.log_tail()}")
                time.sleep(0.5)
            ask_every_system(server.port, systems)
            time.sleep(args.settle)
            rows.append({"generation": n, "seconds": round(time.perf_counter() - start, 1), **memory(server.proc.pid)})
            log.info("%s: generation %d %s", args.label, n, rows[-1])
    finally:
        server.stop()
    return {"systems": systems, "source": str(args.source) if args.source else "this checkout", "rows": rows}


def run(args) -> dict:
    from serve import read_params, scratch_workspace

    params = read_params(args.workspace)
    serve = params["serve"]
    settings = {k: v for k, v in serve.items() if k in KEYS_BEFORE} if args.source else dict(serve)
    with tempfile.TemporaryDirectory(prefix="serve-reload-") as tmp:
        served = scratch_workspace(args.workspace, serve["systems"], Path(tmp) / "ws")
        text = (served / "params.yaml").read_text(encoding="utf-8")
        import yaml

        written = yaml.safe_load(text)
        written["serve"] = {**settings, "systems": serve["systems"]}
        if not args.source:  # the admin token in the scratch workspace, not the user's home
            written["serve"]["admin_token_file"] = str(Path(tmp) / "admin-token")
        (served / "params.yaml").write_text(yaml.safe_dump(written, sort_keys=False, allow_unicode=True), "utf-8")
        return measure(args, served, list(serve["systems"]))


def table(result: dict) -> str:
    labels = list(result["runs"])
    rows = ["| reload | " + " | ".join(f"{label}: RSS GB (peak)" for label in labels) + " |"]
    rows.append("|---:|" + "---:|" * len(labels))
    count = max(len(r["rows"]) for r in result["runs"].values())
    for i in range(count):
        cells = []
        for label in labels:
            found = result["runs"][label]["rows"]
            cells.append(f"{found[i]['rss_gb']:.2f} ({found[i]['peak_gb']:.2f})" if i < len(found) else "")
        rows.append(f"| {'start' if i == 0 else i} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("."))
    parser.add_argument("--reloads", type=int, default=10)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds after a reload's questions before reading")
    parser.add_argument("--source", type=Path, help="another checkout's src/, first on PYTHONPATH")
    parser.add_argument("--label", default="after")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table", type=Path, help="print the Markdown table of a saved result")
    args = parser.parse_args(argv)
    if args.table:
        sys.stdout.write(table(json.loads(args.table.read_text(encoding="utf-8"))) + "\n")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        result = run(args)
    except LexgraphError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    if args.out is None:
        sys.stdout.write(json.dumps(result, indent=1) + "\n")
        return 0
    previous = json.loads(args.out.read_text(encoding="utf-8")) if args.out.exists() else {}
    from lexgraph.core.machine import describe

    merged = {
        "runs": {**previous.get("runs", {}), args.label: result},
        "machine": describe(),
        "question": QUESTION,
    }
    args.out.write_text(json.dumps(merged, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
