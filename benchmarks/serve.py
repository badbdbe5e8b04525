"""Benchmark: `lexgraph serve` under load, against `lexgraph search`'s batch mode on the same system (issue 27).

    .venv/bin/python benchmarks/serve.py [--workspace .] [--systems bm25 dsr gdsr hybrid] [--clients 1 8 32]
        [--seconds 10] [--warmup 2] [--cli-questions 600] [--serve-set max_batch=16] [--out benchmarks/serve.json]
    .venv/bin/python benchmarks/serve.py --table benchmarks/serve.json   # the Markdown tables of a saved result

The workspace ``W`` (``--workspace``, default: this checkout) is a reproduced lexgraph workspace
(``dvc repro``), read only; everything runs on 127.0.0.1.

Server. The real command, ``lexgraph serve --workspace . --host 127.0.0.1 --port 0 --device D``, in
a process of its own as a user runs it (the port it logs; ready once ``/health`` answers). By
default it serves a scratch workspace, a temporary directory with a symbolic link to every entry
of W but params.yaml and a copy of W's params.yaml whose ``serve.systems`` is ``--systems``, so
that only the systems under test are loaded; every other ``serve`` setting (``max_batch``,
``max_wait_ms``, ...) is W's own unless ``--serve-set KEY=VALUE`` changes it in the copy, and the
settings served are recorded in the output. ``--all-systems`` serves W itself.

Load. Closed loop: each of ``--clients`` clients holds one keep-alive HTTP/1.1 connection and
sends ``GET /search?q=...&system=S&k=10``, waits for the whole response, then sends the next.
The questions are W's dev and test questions (``data/clean/questions.parquet``), cycled, client
``i`` of ``C`` starting at question ``i * n / C`` (concurrent requests ask different questions).
Each level runs ``--warmup`` seconds uncounted, then ``--seconds`` seconds: the requests sent and
answered 200 inside that window are counted. Throughput = the sum of the clients' own rates, each
the requests it had answered over the time from sending the first to receiving the last (exact for
a closed loop, where the window's ends would otherwise cut a batch of 32 answers in or out: 5 % of
a dense system's count in 10 s); latency = from sending a request to the last byte of its response,
percentiles by nearest rank (:func:`percentile`). An error is any response other than 200 and any
connection error from the window's start on (the client then reconnects); the goal is none. The
levels run system by system, then the most clients again for every system ``--top-repeat - 1``
times, so that a burst of load elsewhere on the machine does not decide a ratio alone (the best run
is kept, every run is reported).

The load generator is one asyncio event loop in this process on raw sockets: the requests' bytes
are built beforehand and response bodies are not decoded (each system's first answer is, and its
hit ids are compared with the CLI's for the same question). The CPU seconds of the client (this
process) and of the server process in each window are recorded, so a client that took the cores
from the server would show. It costs about 45 µs of CPU a request; ``--client httpx`` runs the
same loop over ``httpx.AsyncClient`` (one per client), about 500 µs a request, ten times more,
which lowers the throughput of 1 and 8 clients on 2 cores (measured with this script, BM25).

Peer, measured in the same run (before the server starts, so nothing else runs):
``lexgraph search --system S --questions F --json --top 10 --device D`` (a subprocess, stdout to a
file) on ``N`` questions and on 1 question; its batch throughput is the marginal
``(N - 1) / (t_N - t_1)`` questions a second, so starting Python and loading the system cancel
out. ``N``: the dev and test questions cycled to at least ``--cli-questions``, grown (up to
``--cli-max-questions``) until ``t_N - t_1`` is at least ``--cli-min-seconds`` (loading varies by
tenths of a second). Each of the two is timed ``--cli-repeat`` times, interleaved; the best is kept.

Reported per system: requests/s, p50/p95/p99 ms, errors and the CPU busy (cores) of server and
client per level; the CLI's q/s; and the ratio best server requests/s at the most ``--clients`` /
CLI q/s, which issue 27 wants at least :data:`GOAL`. The defaults take about 6 minutes on 2 cores;
``--out`` writes the JSON (with the machine's CPU count and the ``serve`` settings served),
``--table`` prints a saved one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from lexgraph.core.arguments import OneLineParser, at_least, non_negative_int, positive_int
from lexgraph.core.errors import DataError, LexgraphError

log = logging.getLogger("serve_bench")

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ("bm25", "dsr", "gdsr", "hybrid")
SPLITS = ("dev", "test")
K = 10  # hits per question, the CLI's --top 10
GOAL = 0.80  # server requests/s at the most clients / CLI batch questions/s (issue 27)
HOST = "127.0.0.1"
PERCENTILES = (50, 95, 99)


# --------------------------------------------------------------------------- statistics


def percentile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (``0 < q <= 100``) of ascending ``ordered``: the smallest
    value with at least ``q`` % of the values at or below it (numpy's ``method="inverted_cdf"``)."""
    if not ordered:
        raise ValueError("no values")
    rank = max(1, math.ceil(round(q * len(ordered) / 100, 9)))
    return ordered[rank - 1]


def summarize(
    latencies_s: Sequence[float],
    errors: dict[str, int],
    seconds: float,
    clients: int,
    spans: Sequence[tuple[int, float]] | None = None,
) -> dict[str, Any]:
    """One level's row: the requests answered 200 in the window, their rate, latency percentiles
    (ms) and errors (total, and by kind). ``spans``: per client, ``(answered, seconds)`` from its
    first request sent to its last answer in the window; the rate is then the sum of the clients'
    own rates, a closed loop's throughput whatever the window's ends cut (a batch of 32 answers
    arriving just inside or just outside it); without them, ``len(latencies_s) / seconds``."""
    ordered = sorted(latencies_s)
    if spans is None:
        rate = len(ordered) / seconds
    else:
        rate = sum(answered / span for answered, span in spans if answered and span > 0)
    row: dict[str, Any] = {
        "clients": clients,
        "seconds": seconds,
        "requests": len(ordered),
        "rps": rate,
        "mean_ms": 1000 * sum(ordered) / len(ordered) if ordered else None,
    }
    for q in PERCENTILES:
        row[f"p{q}_ms"] = 1000 * percentile(ordered, q) if ordered else None
    row["max_ms"] = 1000 * ordered[-1] if ordered else None
    row["errors"] = sum(errors.values())
    row["error_kinds"] = dict(sorted(errors.items()))
    return row


# --------------------------------------------------------------------------- HTTP/1.1 on raw sockets


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """One HTTP/1.1 response from ``reader``: ``(status, body, keep_alive)``."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head[:-4].decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP/1.1 status line: {status_line[:80]!r}")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    framed = True
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        body = await read_chunked(reader)
    else:  # the body ends with the connection
        body, framed = await reader.read(), False
    keep_alive = framed and headers.get("connection", "").lower() != "close" and parts[0] == "HTTP/1.1"
    return int(parts[1]), body, keep_alive


async def read_chunked(reader: asyncio.StreamReader) -> bytes:
    chunks = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                pass
            return b"".join(chunks)
        chunks.append(await reader.readexactly(size))
        await reader.readexactly(2)


def search_request(question: str, system: str, port: int) -> bytes:
    """The bytes of ``GET /search?q=question&system=system&k=K`` on a keep-alive connection."""
    return (
        f"GET /search?q={quote(question, safe='')}&system={quote(system, safe='')}&k={K} HTTP/1.1\r\n"
        f"Host: {HOST}:{port}\r\nUser-Agent: lexgraph-serve-benchmark\r\nAccept: application/json\r\n\r\n"
    ).encode("ascii")


async def fetch(port: int, target: str, timeout: float = 30.0) -> tuple[int, bytes]:
    """``GET target`` on a connection of its own: ``(status, body)``."""

    async def go() -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection(HOST, port)
        try:
            writer.write(f"GET {target} HTTP/1.1\r\nHost: {HOST}:{port}\r\nConnection: close\r\n\r\n".encode())
            status, body, _ = await read_response(reader)
            return status, body
        finally:
            writer.close()

    return await asyncio.wait_for(go(), timeout)


# --------------------------------------------------------------------------- the load generator


@dataclass
class Window:
    """The measured window of one level and what its clients collected in it: the answers sent and
    received inside it, each client's span of them, and every failure from its start on."""

    start: float
    end: float
    latencies: list[float] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)
    spans: dict[int, list] = field(default_factory=dict)  # client -> [first sent, last answered, answers]

    def record(self, client: int, sent: float, done: float, status: int | None, error: str | None = None) -> None:
        if error is None and status == 200:
            if self.start <= sent and done <= self.end:
                self.latencies.append(done - sent)
                span = self.spans.setdefault(client, [sent, done, 0])
                span[1], span[2] = done, span[2] + 1
        elif done >= self.start:  # a failure after the end counts too (a request in flight then)
            self.errors[error or f"HTTP {status}"] += 1

    def client_spans(self) -> list[tuple[int, float]]:
        """``(answers, seconds from the first sent to the last answered)`` of each client."""
        return [(answers, last - first) for first, last, answers in self.spans.values()]


async def raw_client(port: int, requests: Sequence[bytes], first: int, window: Window, me: int = 0) -> None:
    """A closed-loop client on one keep-alive connection until ``window.end`` (reconnects after an error)."""
    clock = time.perf_counter
    writer = reader = None
    i = first
    while clock() < window.end:
        if writer is None:
            try:
                reader, writer = await asyncio.open_connection(HOST, port)
            except OSError as exc:
                window.record(me, clock(), clock(), None, type(exc).__name__)
                await asyncio.sleep(0.05)
                continue
        request = requests[i % len(requests)]
        i += 1
        sent = clock()
        try:
            writer.write(request)
            status, _, keep_alive = await read_response(reader)
        except (OSError, EOFError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            window.record(me, sent, clock(), None, type(exc).__name__)
            writer.close()
            writer = None
            continue
        window.record(me, sent, clock(), status)
        if not keep_alive:
            writer.close()
            writer = None
    if writer is not None:
        writer.close()


async def httpx_client(port: int, targets: Sequence[str], first: int, window: Window, me: int = 0) -> None:
    """The same client over ``httpx.AsyncClient`` (for ``--client httpx``)."""
    import httpx

    clock = time.perf_counter
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(base_url=f"http://{HOST}:{port}", limits=limits, timeout=60, trust_env=False) as c:
        i = first
        while clock() < window.end:
            target = targets[i % len(targets)]
            i += 1
            sent = clock()
            try:
                response = await c.get(target)
            except httpx.HTTPError as exc:
                window.record(me, sent, clock(), None, type(exc).__name__)
                continue
            window.record(me, sent, clock(), response.status_code)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (every thread), from /proc."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_level(
    port: int,
    server_pid: int,
    questions: Sequence[str],
    system: str,
    clients: int,
    warmup: float,
    seconds: float,
    kind: str = "raw",
) -> dict[str, Any]:
    """One level: ``clients`` closed-loop clients for ``warmup + seconds`` seconds; the row of
    :func:`summarize` with the client's and the server's CPU seconds in the measured window."""
    if kind == "httpx":
        work, client = [f"/search?q={quote(q, safe='')}&system={system}&k={K}" for q in questions], httpx_client
    else:
        work, client = [search_request(q, system, port) for q in questions], raw_client
    now = time.perf_counter()
    window = Window(now + warmup, now + warmup + seconds)
    tasks = [asyncio.create_task(client(port, work, i * len(work) // clients, window, i)) for i in range(clients)]
    await asyncio.sleep(max(0.0, window.start - time.perf_counter()))
    cpu = time.process_time(), cpu_seconds(server_pid)
    await asyncio.sleep(max(0.0, window.end - time.perf_counter()))
    cpu = time.process_time() - cpu[0], cpu_seconds(server_pid) - cpu[1]
    done, pending = await asyncio.wait(tasks, timeout=60)  # the requests in flight at the end
    for task in pending:
        task.cancel()
        window.errors["no answer within 60 s of the end"] += 1
    for task in done:
        if task.exception() is not None:
            window.errors[type(task.exception()).__name__] += 1
    row = summarize(window.latencies, window.errors, seconds, clients, window.client_spans())
    row["client_cpu_s"], row["server_cpu_s"] = round(cpu[0], 3), round(cpu[1], 3)
    return row


# --------------------------------------------------------------------------- the workspace, the server, the CLI


def lexgraph_command() -> list[str]:
    """How a user runs lexgraph here: the virtual environment's ``lexgraph`` script, else ``python -m``."""
    script = Path(sys.executable).with_name("lexgraph")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "lexgraph.cli.main"]


def read_questions(workspace: Path) -> list[str]:
    """The dev and test questions of ``workspace``, in id order."""
    from lexgraph.core import layout
    from lexgraph.core.io import read_parquet

    table = read_parquet(layout.CLEAN.under(workspace, "questions.parquet"), ["id", "question", "split"])
    table = table.filter(table["split"].is_in(list(SPLITS))).sort("id")
    questions = [str(q) for q in table["question"].to_list()]
    if not questions:
        raise LexgraphError(f"{workspace}: no dev or test question in data/clean/questions.parquet")
    return questions


def read_params(workspace: Path) -> dict[str, Any]:
    """The workspace's params.yaml, which must have a ``serve`` section."""
    import yaml

    path = workspace / "params.yaml"
    expected = "expected --workspace to be a reproduced lexgraph workspace"
    try:
        params = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise DataError(path, f"cannot be read ({type(exc).__name__}); {expected}") from None
    if not isinstance(params, dict) or not isinstance(params.get("serve"), dict):
        raise DataError(path, f"has no serve section; {expected}")
    return params


def scratch_workspace(workspace: Path, systems: Sequence[str], where: Path, settings: dict | None = None) -> Path:
    """A workspace at ``where`` that serves ``systems``: links to ``workspace``'s entries, its
    params.yaml copied with ``serve.systems`` replaced and the ``serve`` ``settings`` given
    (``workspace`` itself is not touched)."""
    import yaml

    params = read_params(workspace)
    params["serve"].update(settings or {})
    params["serve"]["systems"] = list(systems)
    where.mkdir()
    for entry in workspace.iterdir():
        if entry.name != "params.yaml":
            (where / entry.name).symlink_to(entry.resolve())
    text = yaml.safe_dump(params, sort_keys=False, allow_unicode=True)
    (where / "params.yaml").write_text(text, encoding="utf-8")
    return where


class ServerProcess:
    """``lexgraph serve`` in its own process on a free port of 127.0.0.1 (its log in ``log_path``)."""

    def __init__(self, workspace: Path, device: str, log_path: Path, timeout: float) -> None:
        self.log_path = log_path
        self.command = [*lexgraph_command(), "serve", "--workspace", ".", "--host", HOST, "--port", "0"]
        self.command += ["--device", device]
        with log_path.open("wb") as fh:
            self.proc = subprocess.Popen(self.command, cwd=workspace, stdout=fh, stderr=subprocess.STDOUT)
        try:
            self.port = self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def log_tail(self, lines: int = 5) -> str:
        text = self.log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        return " | ".join(text[-lines:])

    def _wait_ready(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        port = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LexgraphError(f"`lexgraph serve` exited with status {self.proc.returncode}: {self.log_tail()}")
            if port is None:
                found = re.search(r" on http://127\.0\.0\.1:(\d+)/", self.log_path.read_text(errors="replace"))
                port = int(found.group(1)) if found else None
            if port is not None:
                with contextlib.suppress(OSError, asyncio.TimeoutError, ValueError, asyncio.IncompleteReadError):
                    if asyncio.run(fetch(port, "/health", timeout=5))[0] == 200:
                        return port
            time.sleep(0.2)
        raise LexgraphError(f"`lexgraph serve` did not answer /health within {timeout:g} s: {self.log_tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def cycled(questions: Sequence[str], n: int) -> list[str]:
    return [questions[i % len(questions)] for i in range(n)]


def write_questions(questions: Sequence[str], path: Path) -> Path:
    import json

    path.write_text("".join(json.dumps({"id": f"q{i}", "question": q}) + "\n" for i, q in enumerate(questions)))
    return path


def time_cli(workspace: Path, system: str, questions: Path, n: int, device: str, out: Path) -> float:
    """Wall seconds of ``lexgraph search --system SYSTEM --questions QUESTIONS --json --top K``
    (stdout to ``out``, checked to hold ``n`` JSON lines)."""
    command = [*lexgraph_command(), "search", "--workspace", str(workspace), "--system", system]
    command += ["--questions", str(questions), "--json", "--top", str(K), "--device", device]
    with out.open("wb") as fh:
        start = time.perf_counter()
        proc = subprocess.run(command, stdout=fh, stderr=subprocess.PIPE, check=False)
        seconds = time.perf_counter() - start
    if proc.returncode:
        tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no message"]
        raise LexgraphError(f"`lexgraph search --system {system}` exited with status {proc.returncode}: {tail[0]}")
    with out.open("rb") as fh:
        lines = sum(1 for _ in fh)
    if lines != n:
        raise LexgraphError(f"`lexgraph search --system {system}` wrote {lines} JSON lines for {n} questions")
    return seconds


def cli_rate(args, system: str, questions: Sequence[str], tmp: Path) -> dict[str, Any]:
    """The CLI's marginal batch throughput on ``system`` (see the module docstring)."""
    n = math.ceil(args.cli_questions / len(questions)) * len(questions)
    one = write_questions(questions[:1], tmp / f"{system}-1.jsonl")
    many = write_questions(cycled(questions, n), tmp / f"{system}-n.jsonl")

    def timed(path: Path, count: int) -> float:
        return time_cli(args.workspace, system, path, count, args.device, tmp / f"{path.stem}.out")

    t1, tn = [timed(one, 1)], [timed(many, n)]
    if tn[0] - t1[0] < args.cli_min_seconds and n < args.cli_max_questions:  # grow N: t_N - t_1 ~1.5 x the minimum
        rate = (n - 1) / max(tn[0] - t1[0], 0.05)
        want = min(args.cli_max_questions, 1.5 * args.cli_min_seconds * rate)
        n = max(n, math.ceil(want / len(questions)) * len(questions))
        tn = [timed(write_questions(cycled(questions, n), many), n)]
    while len(t1) < args.cli_repeat:  # interleaved: a burst of load on the machine hits both alike
        t1.append(timed(one, 1))
        tn.append(timed(many, n))
    log.info("  cli %s: 1 question %s s, %d questions %s s", system, t1, n, tn)
    import json

    first = json.loads((tmp / f"{system}-1.out").read_text(encoding="utf-8").splitlines()[0])
    return {
        "questions": n,
        "t1_s": [round(t, 3) for t in t1],
        "tn_s": [round(t, 3) for t in tn],
        "qps": (n - 1) / (min(tn) - min(t1)),
        "first_hits": [h["id"] for h in first["hits"]],
    }


# --------------------------------------------------------------------------- the run


def check_out(out: Path) -> None:
    if out.is_dir():
        raise DataError(out, "is a directory; expected --out to name a JSON file")
    if not out.parent.is_dir():
        raise DataError(out, f"{out.parent} is not a directory; expected --out in an existing directory")


def first_answer(port: int, question: str, system: str) -> list:
    """The hit ids the server gives ``question`` (checking the answer's shape)."""
    import json

    status, body = asyncio.run(fetch(port, f"/search?q={quote(question, safe='')}&system={system}&k={K}"))
    answer = json.loads(body)
    if status != 200 or set(answer) != {"question", "system", "generation", "hits"} or answer["system"] != system:
        raise LexgraphError(f"GET /search (system {system}) answered {status}: {body[:200]!r}")
    return [h["id"] for h in answer["hits"]]


def measure(args, server: ServerProcess, questions: Sequence[str], system: str, clients: int, note: str = ""):
    """One level of ``system`` against ``server`` (logged)."""
    row = asyncio.run(
        run_level(server.port, server.proc.pid, questions, system, clients, args.warmup, args.seconds, args.client)
    )
    log.info(
        "  serve %s, %d clients%s: %.1f req/s, p50 %s ms, p99 %s ms, %d errors (CPU s: client %.2f, server %.2f)",
        system,
        clients,
        note,
        row["rps"],
        fmt(row["p50_ms"]),
        fmt(row["p99_ms"]),
        row["errors"],
        row["client_cpu_s"],
        row["server_cpu_s"],
    )
    return row


def serve_levels(args, served: Path, questions: Sequence[str], cli: dict, tmp: Path) -> dict[str, dict]:
    """Start the server on ``served``; run every level of every system against it, then the most
    clients again ``--top-repeat - 1`` times per system (a burst of load elsewhere on the machine
    does not decide the ratio alone)."""
    runs: dict[str, dict] = {}
    log.info("starting lexgraph serve on %s", served)
    server = ServerProcess(served, args.device, tmp / "serve.log", args.start_timeout)
    try:
        for system in args.systems:
            hits = first_answer(server.port, questions[0], system)
            cli[system]["same_first_hits"] = hits == cli[system].pop("first_hits")
            runs[system] = {"levels": [measure(args, server, questions, system, c) for c in args.clients]}
            runs[system]["repeats"] = []
        for r in range(1, args.top_repeat):
            for system in args.systems:
                row = measure(args, server, questions, system, max(args.clients), f" (repeat {r})")
                runs[system]["repeats"].append(row)
    finally:
        server.stop()
    return runs


def run(args: argparse.Namespace) -> dict[str, Any]:
    check_out(args.out)
    args.workspace = args.workspace.resolve()
    params = read_params(args.workspace)
    questions = read_questions(args.workspace)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lexgraph-serve-bench-") as name:
        tmp = Path(name)
        cli = {}
        for system in args.systems:
            log.info("lexgraph search --system %s: batch throughput", system)
            cli[system] = cli_rate(args, system, questions, tmp)
        if args.all_systems:
            served = args.workspace
        else:
            served = scratch_workspace(args.workspace, args.systems, tmp / "ws", dict(args.serve_set))
            params = read_params(served)
        levels = serve_levels(args, served, questions, cli, tmp)
    top = max(args.clients)
    results = {}
    for system in args.systems:
        best = max(top_rows(levels[system], top), key=lambda row: row["rps"])
        results[system] = {**levels[system], "cli": cli[system], "ratio": best["rps"] / cli[system]["qps"]}
    result = {
        "workspace": str(args.workspace),
        "systems": list(args.systems),
        "served": list(args.systems) if not args.all_systems else params["serve"]["systems"],
        "clients": list(args.clients),
        "ratio_clients": top,
        "goal": GOAL,
        "seconds": args.seconds,
        "warmup_s": args.warmup,
        "k": K,
        "questions": len(questions),
        "client": args.client,
        "device": args.device,
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "serve": {key: value for key, value in params["serve"].items() if key != "systems"},
        "commands": {"serve": "lexgraph serve --host 127.0.0.1 --port 0", "cli": f"lexgraph search --json --top {K}"},
        "results": results,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    from lexgraph.core.io import write_json

    write_json(result, args.out)
    log.info("wrote %s", args.out)
    return result


# --------------------------------------------------------------------------- tables


def top_rows(runs: dict[str, list], top: int) -> list[dict]:
    """The rows of a system's runs at ``top`` clients (its level and the repeats)."""
    return [row for row in runs["levels"] if row["clients"] == top] + runs.get("repeats", [])


def fmt(value, spec: str = ".1f") -> str:
    return "n/a" if value is None else format(value, spec)


def markdown_tables(result: dict[str, Any]) -> str:
    """The load table (one row per system and level, repeats of the most clients marked) and the
    ratio table (per system: the CLI's q/s, the best server run at the most clients, their ratio)."""
    lines = [
        "| System | Clients | Requests | Requests/s | p50 ms | p95 ms | p99 ms | Errors | Server CPU | Client CPU |",
        "|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for system, res in result["results"].items():
        rows = [(row, "") for row in res["levels"]] + [(row, " (repeat)") for row in res.get("repeats", [])]
        for row, note in rows:
            lines.append(
                f"| {system} | {row['clients']}{note} | {row['requests']:,} | {row['rps']:.1f} | "
                f"{fmt(row['p50_ms'])} | {fmt(row['p95_ms'])} | {fmt(row['p99_ms'])} | {row['errors']} | "
                f"{row['server_cpu_s'] / row['seconds']:.2f} | {row['client_cpu_s'] / row['seconds']:.2f} |"
            )
    top, goal = result["ratio_clients"], result["goal"]
    lines += [
        "",
        f"| System | CLI batch q/s (N) | Server req/s, {top} clients (runs) | Ratio | ≥ {goal:.2f} | Same hits |",
        "|:---|---:|---:|---:|:---:|:---:|",
    ]
    for system, res in result["results"].items():
        tops = [row["rps"] for row in top_rows(res, top)]
        same = {True: "yes", False: "no"}.get(res["cli"].get("same_first_hits"), "n/a")
        lines.append(
            f"| {system} | {res['cli']['qps']:.1f} ({res['cli']['questions']:,}) | {max(tops):.1f} "
            f"({', '.join(f'{r:.1f}' for r in tops)}) | {res['ratio']:.2f} | {'yes' if res['ratio'] >= goal else 'no'} "
            f"| {same} |"
        )
    serve = result["serve"]
    lines.append(
        f"\n{result['questions']} dev+test questions cycled, k = {result['k']}; {result['seconds']} s per level after "
        f"{result['warmup_s']} s of warm-up; {result['client']} client; CPU: cores busy over the window; ratio: the "
        f"best run at {top} clients / the CLI's marginal q/s (best of its timings); {result['cpu_count']} CPUs "
        f"({result['cpus_usable']} usable); serve.max_batch {serve.get('max_batch')}, serve.max_wait_ms "
        f"{serve.get('max_wait_ms')}; systems loaded: {', '.join(result['served'])}; {result.get('wall_s', 'n/a')} s."
    )
    return "\n".join(lines)


def read_result(path: Path) -> dict[str, Any]:
    """An earlier ``--out`` file, checked for the keys :func:`markdown_tables` reads."""
    from lexgraph.core.inputs import read_json_object

    return read_json_object(
        path,
        what="the JSON that benchmarks/serve.py --out writes",
        fix="rerun benchmarks/serve.py --out FILE",
        keys={
            key: (lambda v, t=t: isinstance(v, t), what)
            for key, t, what in (
                ("results", dict, "an object of systems"),
                ("serve", dict, "the serve settings"),
                ("ratio_clients", int, "a number of clients"),
                ("goal", float, "a ratio"),
                ("served", list, "a list of systems"),
            )
        },
    )


# --------------------------------------------------------------------------- driver


def serve_setting(text: str) -> tuple[str, Any]:
    """An argparse type: ``KEY=VALUE``, a number-valued setting of params.yaml's ``serve`` section."""
    key, _, value = text.partition("=")
    if key in ("", "systems") or not value or not re.fullmatch(r"[a-z_]+", key):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE with a serve setting other than systems, got {text!r}")
    try:
        return key, int(value) if value.lstrip("-").isdigit() else float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number after {key}=, got {value!r}") from None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from lexgraph.methods.catalog import names

    parser = OneLineParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", type=Path, metavar="JSON", help="print the tables of an earlier --out and exit")
    parser.add_argument("--workspace", type=Path, default=ROOT, help="a reproduced lexgraph workspace, read only")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "serve.json", help="JSON results file")
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=names(), metavar="SYSTEM")
    parser.add_argument("--clients", nargs="+", type=positive_int, default=[1, 8, 32], help="concurrency levels")
    parser.add_argument("--seconds", type=positive_int, default=10, help="measured seconds per level")
    parser.add_argument("--warmup", type=non_negative_int, default=2, help="uncounted seconds before each level")
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw", help="the load generator's HTTP client")
    parser.add_argument("--device", default="auto", help="--device of lexgraph serve and lexgraph search")
    parser.add_argument("--all-systems", action="store_true", help="serve the workspace's own serve.systems")
    parser.add_argument(
        "--serve-set",
        type=serve_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a serve setting of the scratch workspace, other than the workspace's (max_batch=16); repeatable",
    )
    parser.add_argument("--start-timeout", type=positive_int, default=600, help="seconds for the server to load")
    parser.add_argument("--cli-questions", type=at_least(2), default=600, help="the CLI's N, at least")
    parser.add_argument("--cli-max-questions", type=at_least(2), default=20000, help="the CLI's N, at most")
    parser.add_argument("--cli-min-seconds", type=positive_int, default=5, help="t_N - t_1 wanted, at least")
    parser.add_argument("--cli-repeat", type=positive_int, default=2, help="timings of t_1 and t_N (best kept)")
    parser.add_argument("--top-repeat", type=positive_int, default=2, help="runs of the most clients (best kept)")
    args = parser.parse_args(argv)
    if args.table is None and len(set(args.systems)) < len(args.systems):
        parser.error(f"argument --systems: {' '.join(args.systems)} names a system twice; expected each once")
    if args.serve_set and args.all_systems:
        parser.error("argument --serve-set: the workspace's own settings are served with --all-systems; drop one")
    args.clients = sorted(set(args.clients))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    try:
        result = read_result(args.table) if args.table else run(args)
        print(markdown_tables(result))
    except LexgraphError as exc:
        print(f"serve.py: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
