"""benchmarks/serve.py (issue 27's load benchmark): its statistics against hand computations and
numpy, its HTTP/1.1 response reader on known bytes, its scratch workspace, its tables, and its
refusals of bad arguments and of a damaged saved result. No server is started and nothing is timed."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import ROOT, load_benchmark
from helpers_scripts import run_script

bench = load_benchmark("serve")


def test_percentile_is_the_nearest_rank_by_hand():
    values = [0.01 * i for i in range(1, 11)]  # 10 ms .. 100 ms
    # nearest rank: the ceil(q/100 * n)-th smallest value
    assert bench.percentile(values, 50) == values[4]  # rank 5
    assert bench.percentile(values, 95) == values[9]  # rank ceil(9.5) = 10
    assert bench.percentile(values, 99) == values[9]
    assert bench.percentile(values, 10) == values[0]  # rank 1 exactly, not 2
    assert bench.percentile(values, 11) == values[1]
    assert bench.percentile([0.5], 99) == 0.5
    with pytest.raises(ValueError):
        bench.percentile([], 50)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 20, 100, 101, 999, 4321])
def test_percentile_matches_numpy_inverted_cdf(n):
    latencies = sorted(np.random.default_rng(n).lognormal(-4.0, 1.0, n).tolist())
    for q in (1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9, 100):
        assert bench.percentile(latencies, q) == np.percentile(latencies, q, method="inverted_cdf"), (n, q)


def test_summarize_by_hand():
    latencies = [0.004, 0.001, 0.003, 0.002] * 25  # 100 answers: 25 each of 1, 2, 3 and 4 ms, unsorted
    row = bench.summarize(latencies, {"HTTP 503": 2, "ConnectionResetError": 1}, seconds=4, clients=8)
    assert row["clients"] == 8 and row["seconds"] == 4
    assert row["requests"] == 100 and row["rps"] == 25.0
    assert row["mean_ms"] == pytest.approx(2.5)
    assert row["p50_ms"] == pytest.approx(2.0)  # rank 50: the last of the 2 ms
    assert row["p95_ms"] == pytest.approx(4.0) and row["p99_ms"] == pytest.approx(4.0)
    assert row["max_ms"] == pytest.approx(4.0)
    assert row["errors"] == 3
    assert row["error_kinds"] == {"ConnectionResetError": 1, "HTTP 503": 2}


def test_summarize_without_an_answer():
    row = bench.summarize([], {"ConnectionRefusedError": 4}, seconds=10, clients=1)
    assert row["requests"] == 0 and row["rps"] == 0.0 and row["errors"] == 4
    assert row["p50_ms"] is None and row["p99_ms"] is None and row["mean_ms"] is None


def test_summarize_rate_from_the_clients_spans_by_hand():
    # client 0: 10 answers in 2 s (5/s); client 1: 3 answers in 0.5 s (6/s); client 2: nothing answered
    row = bench.summarize([0.1] * 13, {}, seconds=4, clients=3, spans=[(10, 2.0), (3, 0.5), (0, 0.0)])
    assert row["requests"] == 13 and row["rps"] == pytest.approx(11.0)
    assert bench.summarize([], {}, seconds=4, clients=1, spans=[])["rps"] == 0


def test_window_counts_answers_inside_it_and_failures_from_its_start():
    window = bench.Window(start=10.0, end=20.0)
    window.record(0, 9.0, 9.5, 200)  # before the window: not counted
    window.record(0, 9.9, 10.1, 200)  # sent in the warm-up: not counted
    window.record(0, 10.1, 10.4, 200)
    window.record(1, 12.0, 12.5, 200)
    window.record(0, 15.0, 15.25, 200)
    window.record(1, 15.0, 15.5, 503)
    window.record(0, 16.0, 16.0, None, "ConnectionResetError")
    window.record(1, 19.9, 20.5, 200)  # answered after the end: not counted
    window.record(1, 19.9, 20.5, 500)  # but a failure then is
    window.record(1, 9.0, 9.5, 500)  # a failure in the warm-up is not
    assert window.latencies == pytest.approx([0.3, 0.5, 0.25])
    assert window.errors == {"HTTP 503": 1, "ConnectionResetError": 1, "HTTP 500": 1}
    assert window.client_spans() == [(2, pytest.approx(5.15)), (1, pytest.approx(0.5))]


def test_a_closed_loop_rate_is_not_cut_by_the_window():
    """32 clients answered together every 0.5 s (batches): 64 a second, wherever the window falls."""
    for offset in (0.0, 0.1, 0.49):
        window = bench.Window(start=10.0 + offset, end=20.0 + offset)
        for client in range(32):
            for batch in range(50):
                window.record(client, 0.5 * batch, 0.5 * (batch + 1), 200)
        row = bench.summarize(window.latencies, window.errors, 10, 32, window.client_spans())
        assert row["rps"] == pytest.approx(64.0), offset
        assert row["requests"] == 32 * (20 if offset == 0 else 19)  # counting alone: 64/s or 60.8/s


def _read(data: bytes, count: int = 1):
    async def go():
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return [await bench.read_response(reader) for _ in range(count)]

    return asyncio.run(go())


def test_read_response_keep_alive_close_and_pipelined():
    ok = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"hits":[]}'
    refused = b'HTTP/1.1 408 Request Timeout\r\nContent-Length: 13\r\nConnection: close\r\n\r\n{"error":"x"}'
    first, second = _read(ok + refused, 2)
    assert first == (200, b'{"hits":[]}', True)
    assert second == (408, b'{"error":"x"}', False)


def test_read_response_chunked_and_unframed():
    chunked = b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{"a"\r\n3;x=1\r\n:1}\r\n0\r\n\r\n'
    assert _read(chunked) == [(200, b'{"a":1}', True)]
    unframed = b"HTTP/1.1 500 Internal Server Error\r\n\r\nboom"
    assert _read(unframed) == [(500, b"boom", False)]
    assert _read(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n") == [(200, b"", False)]


def test_read_response_refuses_what_is_not_http():
    with pytest.raises(ValueError, match="not an HTTP/1.1 status line"):
        _read(b"SSH-2.0-OpenSSH\r\n\r\n")
    with pytest.raises(asyncio.IncompleteReadError):
        _read(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort")


def test_search_request_quotes_the_question():
    request = bench.search_request("Qui paie le mur mitoyen ? (art. 655 & 656)", "dsr", 8123)
    line, *headers = request.decode("ascii").split("\r\n")
    assert line == (
        "GET /search?q=Qui%20paie%20le%20mur%20mitoyen%20%3F%20%28art.%20655%20%26%20656%29&system=dsr&k=10 HTTP/1.1"
    )
    assert "Host: 127.0.0.1:8123" in headers and request.endswith(b"\r\n\r\n")
    assert "%C3%A9" in bench.search_request("réparation", "bm25", 1).decode("ascii")


def test_serve_setting():
    assert bench.serve_setting("max_batch=16") == ("max_batch", 16)
    assert bench.serve_setting("max_wait_ms=2.5") == ("max_wait_ms", 2.5)


def test_cycled_questions():
    assert bench.cycled(["a", "b", "c"], 7) == ["a", "b", "c", "a", "b", "c", "a"]


def test_scratch_workspace_serves_the_systems_asked_and_leaves_the_workspace_alone(tmp_path):
    workspace = tmp_path / "ws"
    (workspace / "data").mkdir(parents=True)
    (workspace / "models").mkdir()
    (workspace / "dvc.yaml").write_text("stages: {}\n", encoding="utf-8")
    params = {"bm25": {"k1": 0.9}, "serve": {"systems": ["hybrid", "bm25", "dsr", "xrerank"], "max_batch": 32}}
    text = yaml.safe_dump(params, sort_keys=False)
    (workspace / "params.yaml").write_text(text, encoding="utf-8")
    scratch = bench.scratch_workspace(workspace, ["dsr", "bm25"], tmp_path / "scratch", {"max_wait_ms": 10})
    served = yaml.safe_load((scratch / "params.yaml").read_text(encoding="utf-8"))
    assert served == {**params, "serve": {"systems": ["dsr", "bm25"], "max_batch": 32, "max_wait_ms": 10}}
    assert (scratch / "data").resolve() == (workspace / "data").resolve() and (scratch / "models").is_symlink()
    assert (scratch / "dvc.yaml").is_symlink() and not (scratch / "params.yaml").is_symlink()
    assert (workspace / "params.yaml").read_text(encoding="utf-8") == text


def _result() -> dict:
    def row(clients, rps, p50=10.0):
        return {
            "clients": clients,
            "seconds": 10,
            "requests": int(rps * 10),
            "rps": rps,
            "p50_ms": p50,
            "p95_ms": 2 * p50,
            "p99_ms": 3 * p50,
            "errors": 0,
            "server_cpu_s": 19.0,
            "client_cpu_s": 0.5,
        }

    levels = {"levels": [row(1, 30.0), row(32, 60.0, 500.0)], "repeats": [row(32, 72.0, 400.0)]}
    return {
        "results": {
            "dsr": {**levels, "cli": {"qps": 80.0, "questions": 630, "same_first_hits": True}, "ratio": 0.9},
            "bm25": {"levels": [row(32, 400.0)], "cli": {"qps": 800.0, "questions": 4200}, "ratio": 0.5},
        },
        "ratio_clients": 32,
        "goal": 0.8,
        "served": ["dsr", "bm25"],
        "serve": {"max_batch": 32, "max_wait_ms": 2},
        "questions": 105,
        "k": 10,
        "seconds": 10,
        "warmup_s": 2,
        "client": "raw",
        "cpu_count": 2,
        "cpus_usable": 2,
    }


def test_markdown_tables_of_a_result():
    lines = bench.markdown_tables(_result()).splitlines()
    assert "| dsr | 1 | 300 | 30.0 | 10.0 | 20.0 | 30.0 | 0 | 1.90 | 0.05 |" in lines
    assert "| dsr | 32 (repeat) | 720 | 72.0 | 400.0 | 800.0 | 1200.0 | 0 | 1.90 | 0.05 |" in lines
    assert "| dsr | 80.0 (630) | 72.0 (60.0, 72.0) | 0.90 | yes | yes |" in lines
    assert "| bm25 | 800.0 (4,200) | 400.0 (400.0) | 0.50 | no | n/a |" in lines
    assert bench.top_rows(_result()["results"]["dsr"], 32) == [
        _result()["results"]["dsr"]["levels"][1],
        _result()["results"]["dsr"]["repeats"][0],
    ]


def _bench(capsys, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python benchmarks/serve.py ARGS`` run in this process (tests/helpers_scripts.py: its
    ``__main__`` block, a traceback fails the test): its exit status, stdout and stderr. A fresh
    interpreter spent ~5 s importing the catalogue of systems (torch) before the refusal."""
    capsys.readouterr()
    status = run_script(ROOT / "benchmarks" / "serve.py", *args, cwd=cwd)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["serve.py", *args], status, out, err)


def _one_line(proc: subprocess.CompletedProcess, *expected: str) -> str:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("serve.py: error: "), proc.stderr
    for part in expected:
        assert part in lines[0], proc.stderr
    return lines[0]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--systems", "nope"], "argument --systems: invalid choice: 'nope'"),
        (["--systems", "dsr", "dsr"], "argument --systems: dsr dsr names a system twice"),
        (["--client", "curl"], "argument --client: invalid choice: 'curl'"),
        (["--serve-set", "max_batch"], "argument --serve-set: expected KEY=VALUE"),
        (["--serve-set", "systems=1"], "a serve setting other than systems"),
        (["--serve-set", "max_batch=many"], "argument --serve-set: expected a number after max_batch="),
        (["--all-systems", "--serve-set", "max_batch=8"], "the workspace's own settings are served"),
    ],
)
def test_bad_arguments_are_one_line(tmp_path, capsys, args, expected):
    _one_line(_bench(capsys, *args, cwd=tmp_path), expected)
    assert not any(tmp_path.iterdir())


def test_out_under_a_file_is_refused_before_any_work(tmp_path, capsys):
    (tmp_path / "results").write_text("earlier\n", encoding="utf-8")
    proc = _bench(capsys, "--out", str(tmp_path / "results" / "serve.json"), cwd=tmp_path)
    _one_line(proc, "results/serve.json", "is not a directory")
    assert (tmp_path / "results").read_text(encoding="utf-8") == "earlier\n"


def test_a_directory_that_is_no_workspace_is_one_line(tmp_path, capsys):
    proc = _bench(capsys, "--workspace", str(tmp_path), "--out", str(tmp_path / "serve.json"), cwd=tmp_path)
    _one_line(proc, "params.yaml")
    assert not (tmp_path / "serve.json").exists()


@pytest.mark.parametrize(
    ("text", "expected"),
    [("{bad", "not valid JSON"), ('{"results": {}}', "key 'serve' is missing")],
    ids=["corrupt", "foreign"],
)
def test_table_of_a_damaged_or_foreign_file(tmp_path, capsys, text, expected):
    saved = tmp_path / "serve.json"
    saved.write_text(text, encoding="utf-8")
    proc = _bench(capsys, "--table", str(saved), cwd=tmp_path)
    _one_line(proc, str(saved), expected, "expected the JSON that benchmarks/serve.py --out writes")
    assert proc.stdout == "" and saved.read_text(encoding="utf-8") == text


def test_the_docs_tables_are_the_committed_result():
    """docs/serve.md's load tables are ``--table benchmarks/serve.json`` line for line (rerun the
    benchmark, then paste its tables)."""
    bench = load_benchmark("serve")
    result = bench.read_result(ROOT / "benchmarks" / "serve.json")
    expected = [line for line in bench.markdown_tables(result).splitlines() if line.startswith("|")]
    docs = (ROOT / "docs" / "serve.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(docs) if line.startswith("<!-- serve load tables"))
    end = next(i for i in range(start + 1, len(docs)) if docs[i].startswith("**What the run shows"))
    assert [line for line in docs[start:end] if line.startswith("|")] == expected
