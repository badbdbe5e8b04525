"""Benchmark: the walk from each paper's method to lexgraph's recipe, one change at a time.

    python benchmarks/walk.py [--workspace .] [--walks gdsr qabisar mvcl] [--json benchmarks/walk.json]

Why: ``gdsr``, ``qabisar`` and ``mvcl`` (the papers as published, on the sample's budget rule)
and lexgraph's ``hgraph``, ``hgraph_qa`` and ``xrerank`` differ in many ways at once; a
researcher wants to know which of lexgraph's departures matter, and by how much. Each walk
starts at a paper's system and changes one group of settings per row until it reaches
lexgraph's recipe as the default run trained it:

* ``gdsr`` -> ``hgraph``: residual, prior start, article-mean headings, lexgraph's attention,
  lexgraph's training;
* ``qabisar`` -> ``hgraph_qa``: from QABISAR's own first stage (its dot-product DSR, which the
  paper profile trains and the sample's default run leaves out) to the default run's qabisar
  (G-DSR's DSR first), then the label-leak cut, a residual GATv2 stack, cosine scoring,
  lexgraph's start and attention, lexgraph's training (no distillation);
* ``mvcl`` -> ``xrerank``: from MVCL as published (trained here: the default run leaves it
  out for its cost) to the frozen PLM, lexgraph's network, cosine alignment, the MaxSim start,
  xrerank's inputs and training, and the fusion with the first stage.

Every row is trained as its stage trains it (the same settings objects, seed and code: the
``train_gnn``, ``train_dsr_qabisar``, ``embed`` and ``rerank`` stages' own functions), written
into a scratch workspace beside the real one (which it reads and never writes), and searched
through the system loaders ``evaluate`` uses; its dev and test runs are scored with
:mod:`lexgraph.metrics.ir`. Where a row is a system of the default run, its numbers are the
default run's own runs (``data/runs/<system>``) and the walk reports whether retraining it here
gives the same runs (``reproduces``: the share of questions with the same top 100). Each change
is tested against the row before on the test split with the paired randomisation test of
:mod:`lexgraph.metrics.significance` (10,000 resamples), Holm-adjusted over every test of its
walk (rows x metrics). This benchmark only measures; choices are made on dev elsewhere.
docs/walk.md is generated from the JSON (``docs/gen_walk.py``), and docs/results.md's summary of
the papers' systems (``docs/gen_results.py``); tests/test_docs.py keeps both equal to it.
A start the default run does not hold (``mvcl``) is also tested against DSR and hprior
(``versus``: Holm over those six tests), which metrics/significance.json cannot do.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("walk")

METRICS = ("recall@100", "map", "ndcg@10")
SPLITS = ("dev", "test")
RESAMPLES = 10_000
DEPTH = 500
BASELINES = ("dsr", "hprior")  # a start the default run does not hold is tested against these


def on_cpu(seed: int):
    """The context the stages get from run_stage, on the CPU."""
    from lexgraph.core.stage import StageContext

    return StageContext(seed=seed, device="cpu")


@dataclass(frozen=True)
class Step:
    """One row: what changes (``label``), the keys of the variant's mapping it sets and those it
    drops; no keys: the end system's own mapping (whatever still differs)."""

    label: str
    keys: dict = field(default_factory=dict)
    drop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Walk:
    section: str  # gnn | rerank
    start: str  # the paper's system (the variant the rows train as)
    end: str  # lexgraph's recipe
    steps: tuple[Step, ...]
    default_start: bool = True  # the start is a system of the default run (else trained here)
    first_stage_row: bool = False  # a row before the start: QABISAR's own first stage


GNN_ATTENTION = {"heads": 4, "attention_dropout": 0.1, "self_loops": False, "activation": "elu"}
FROZEN = Step(
    "+ the PLM frozen: its states cached once, only the interaction network trains",
    {"plm": "frozen"},
    drop=("plm_lr", "plm_layers"),
)

WALKS = {
    "gdsr": Walk(
        "gnn",
        "gdsr",
        "hgraph",
        (
            Step(
                "+ identity residual h + GATv2(h) at the node width",
                {"residual": True, "hidden": None, "projections": "linear"},
            ),
            Step("+ the hierarchy-prior start (the untrained encoder is hprior)", {"init": "prior"}),
            Step(
                "+ article-mean heading features, unit-length inputs",
                {"heading_features": "articles", "normalize_features": True},
            ),
            Step("+ lexgraph's attention: 4 heads, ELU, attention dropout, no self-loops", GNN_ATTENTION),
            Step("+ lexgraph's training: train pairs only, batch 64, a linear schedule, the epoch chosen on dev"),
        ),
    ),
    "qabisar": Walk(
        "gnn",
        "qabisar",
        "hgraph_qa",
        (
            Step("+ the label-leak cut (a positive never hears its own question)", {"leak_cut": True}),
            Step("+ a GATv2 stack with the identity residual h + GATv2(h)", {"layer": "stack", "residual": True}),
            Step(
                "+ cosine / 0.01 on unit-length inputs",
                {"similarity": "cosine", "temperature": 0.01, "normalize_features": True},
            ),
            Step(
                "+ the prior start, article-mean headings, a convolution per edge group",
                {
                    "init": "prior",
                    "heading_features": "articles",
                    "edge_attention": "per_group",
                    "self_loops": False,
                    "attention_dropout": 0.1,
                },
            ),
            Step("+ lexgraph's training: no distillation, batch 64, a linear schedule, the epoch chosen on dev"),
        ),
        first_stage_row=True,
    ),
    "mvcl": Walk(
        "rerank",
        "mvcl",
        "xrerank",
        (
            FROZEN,
            Step(
                "+ lexgraph's network: the states projected, tanh pooling over the projection",
                {"projection": True, "pooling": "tanh"},
            ),
            Step("+ cosine / 0.05 alignment", {"alignment": "cosine", "align_temperature": 0.05}),
            Step("+ the MaxSim match features and warm start", {"match_features": True, "warm_start": True}),
            Step(
                "+ xrerank's inputs: 64-token questions, the first 128 article tokens (the encode_rerank cache)",
                {"max_query_length": 64, "max_article_length": 128, "truncation": "right"},
            ),
            Step(
                "+ xrerank's training: lr 3e-4, weight decay 0.01, 5 epochs, mAP selection, margin ranking",
                {"lr": 3.0e-4, "weight_decay": 0.01, "epochs": 5, "metric": "map", "ranking": "margin"},
            ),
            Step("+ fused with the first stage at the alpha chosen on dev"),
        ),
        default_start=False,
    ),
}


# ---------------------------------------------------------------------------
# A scratch workspace: the real one's artefacts, and the rows' own models
# ---------------------------------------------------------------------------

#: what the rows write in the scratch workspace (everything else there links to the real one)
WRITTEN = {
    "models": {"gnn_gdsr", "gnn_qabisar", "gnn_hgraph", "gnn_hgraph_qa", "dsr_qabisar", "mvcl", "xrerank"},
    "data": {"embed_qabisar"},
}


def own(path: Path) -> None:
    """Make ``path`` the scratch workspace's own: a link to the real workspace is unlinked (never
    followed), a directory of an earlier row removed."""
    if path.is_symlink():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


class Workspace:
    """The reproduced workspace a walk reads and never writes, and a scratch one beside it whose
    ``data/`` and ``models/`` entries link to the real ones but for those the rows write."""

    def __init__(self, root: Path, scratch: Path) -> None:
        from lexgraph.core import layout
        from lexgraph.core.config import load_params
        from lexgraph.core.io import read_parquet

        self.root, self.scratch, self.layout = root, scratch, layout
        from lexgraph.core.config import read_params

        self.base = load_params("gnn", root / "params.yaml")[0]
        self.sections = copy.deepcopy(read_params(root / "params.yaml"))
        questions = read_parquet(
            layout.CLEAN.under(root, "questions.parquet"), ["id", "question", "article_ids", "split"]
        )
        self.questions = {s: questions.filter(questions["split"] == s).sort("id") for s in SPLITS}
        self.qrels = {
            s: {int(q): set(g) for q, g in zip(t["id"], t["article_ids"].to_list())} for s, t in self.questions.items()
        }
        shutil.copy(root / "params.yaml", scratch / "params.yaml")
        (scratch / "metrics").symlink_to((root / "metrics").resolve())  # the artefacts' provenance names some
        for top, written in WRITTEN.items():
            (scratch / top).mkdir(parents=True, exist_ok=True)
            for entry in (root / top).iterdir():
                if entry.name not in written and not entry.name.startswith("."):
                    (scratch / top / entry.name).symlink_to(entry.resolve())

    def reset(self) -> None:
        """The scratch workspace as at the start: the rows' own outputs replaced by links to the
        real ones (a walk's first stage, e.g. the hybrid, was built from those)."""
        for top, written in WRITTEN.items():
            for name in written:
                own(self.scratch / top / name)
                if (self.root / top / name).exists():
                    (self.scratch / top / name).symlink_to((self.root / top / name).resolve())

    def mapping(self, section: str, variant: str) -> dict:
        return copy.deepcopy(self.sections[section][variant])

    def seeded(self) -> None:
        from lexgraph.core.config import seed_everything, set_deterministic

        set_deterministic(self.base.deterministic)
        seed_everything(self.base.seed)  # as run_stage does before a stage's work

    def train_gnn(self, variant: str, mapping: dict, first_stage: bool = False) -> None:
        """``train_gnn@<variant>`` with ``gnn.<variant>`` = ``mapping`` (from the scratch workspace's own
        QABISAR first stage with ``first_stage``), into the scratch workspace."""
        from lexgraph.methods.gnn.config import GNNSettings
        from lexgraph.methods.gnn.io import TrainGnnPaths
        from lexgraph.methods.gnn.stage import run_train_gnn

        layout, root, scratch = self.layout, self.root, self.scratch
        settings = GNNSettings.from_params({**self.sections["gnn"], variant: mapping}, variant)
        out = layout.GNN[variant].under(scratch)
        own(out)
        dsr, embed = (layout.DSR_QABISAR, layout.EMBED_QABISAR) if first_stage else (layout.DSR, layout.EMBED)
        paths = TrainGnnPaths(
            graph=layout.GRAPH.under(root),
            embed=embed.under(scratch),
            questions=layout.CLEAN.under(root, "questions.parquet"),
            synthetic=layout.SYNTHETIC.under(root),
            negatives=layout.NEGATIVES.under(root),
            dsr=dsr.under(scratch),
            fallback_dsr=layout.DSR.under(scratch),
            fallback_embed=layout.EMBED.under(scratch),
            hprior=layout.HPRIOR.under(root),
            out=out,
            metrics=scratch / f"train_gnn_{variant}.json",
            plot=scratch / f"train_gnn_{variant}_curve.csv",
        )
        self.seeded()
        run_train_gnn(paths, settings, on_cpu(self.base.seed))

    def train_first_stage(self) -> None:
        """QABISAR's own first stage (``train_dsr_qabisar`` switched on) and its ``embed_qabisar``."""
        from lexgraph.encoding.embed import EmbedConfig, EmbedPaths, run_embed
        from lexgraph.methods.dsr.config import QabisarDSRSettings
        from lexgraph.methods.dsr.train import TrainDsrPaths, run_train_dsr_qabisar

        layout, root, scratch = self.layout, self.root, self.scratch
        enabled = {**self.sections["dsr_qabisar"], "enabled": True}
        settings = QabisarDSRSettings.from_sections({"dsr": self.sections["dsr"], "dsr_qabisar": enabled})
        clean = layout.CLEAN.under(root)
        own(layout.DSR_QABISAR.under(scratch))
        own(layout.EMBED_QABISAR.under(scratch))
        self.seeded()
        run_train_dsr_qabisar(
            TrainDsrPaths(
                articles=clean / "articles.parquet",
                questions=clean / "questions.parquet",
                synthetic=layout.SYNTHETIC.under(root),
                negatives=layout.NEGATIVES.under(root),
                pretrained=layout.PRETRAIN.under(root),
                chunks=layout.CHUNKS.under(root),
                out=layout.DSR_QABISAR.under(scratch),
                metrics=scratch / "train_dsr_qabisar.json",
                plot=scratch / "train_dsr_qabisar_curve.csv",
            ),
            settings,
            on_cpu(self.base.seed),
        )
        embed = EmbedConfig.from_params(self.sections["embed"])
        self.seeded()
        run_embed(
            EmbedPaths(
                dsr=layout.DSR_QABISAR.under(scratch),
                chunks=layout.CHUNKS.under(root),
                articles=clean / "articles.parquet",
                headings=clean / "headings.parquet",
                questions=clean / "questions.parquet",
                synthetic=layout.SYNTHETIC.under(root),
                out=layout.EMBED_QABISAR.under(scratch),
            ),
            embed,
            on_cpu(self.base.seed),
        )

    def train_rerank(self, variant: str, mapping: dict) -> None:
        """``rerank@<variant>`` with ``rerank.<variant>`` = ``mapping``, into the scratch workspace."""
        from lexgraph.methods.rerank.config import RerankConfig
        from lexgraph.methods.rerank.stage import RerankPaths, run_rerank
        from lexgraph.systems.registry import load_retriever

        layout, root, scratch = self.layout, self.root, self.scratch
        config = RerankConfig.from_params({**self.sections["rerank"], variant: mapping}, variant)
        out = layout.RERANKERS[variant].under(scratch)
        own(out)
        paths = RerankPaths(
            questions=layout.CLEAN.under(root, "questions.parquet"),
            articles=layout.CLEAN.under(root, "articles.parquet"),
            features=layout.RERANK_FEATURES.under(root),
            pretrain=layout.PRETRAIN.under(root),
            workspace=scratch,
            out=out,
            metrics=scratch / f"rerank_{variant}.json",
            plot=scratch / f"rerank_{variant}_curve.csv",
        )
        self.seeded()
        run_rerank(paths, config, on_cpu(self.base.seed), lambda: load_retriever(config.first_stage, scratch, "cpu"))

    def runs(self, system: str) -> dict[str, dict[int, list[int]]]:
        """Dev and test runs (top 500) of the scratch workspace's ``system``, as evaluate searches."""
        from lexgraph.systems.registry import load_retriever

        retriever = load_retriever(system, self.scratch, "cpu")
        runs = {}
        for split, table in self.questions.items():
            ids, _ = retriever.search(table["question"].to_list(), DEPTH)
            runs[split] = {int(q): [int(a) for a in row if a >= 0] for q, row in zip(table["id"], ids)}
        return runs

    def default_runs(self, system: str) -> dict[str, dict[int, list[int]]]:
        """The default run's own runs of ``system`` (``data/runs/<system>/<split>.trec``)."""
        from lexgraph.evaluation.trec import read_trec

        return {s: read_trec(self.layout.RUNS.under(self.root, system, f"{s}.trec")) for s in SPLITS}


# ---------------------------------------------------------------------------
# A walk
# ---------------------------------------------------------------------------


def scores(runs: dict, qrels: dict) -> dict[str, dict[str, list[float]]]:
    """Per split and metric, the per-question values in question order."""
    from lexgraph.metrics.ir import per_query

    out = {}
    for split in SPLITS:
        table = per_query(runs[split], qrels[split])
        out[split] = {m: [table[q][m] for q in sorted(qrels[split])] for m in METRICS}
    return out


def same_runs(a: dict, b: dict, depth: int = 100) -> float:
    """Share of the questions whose top-``depth`` lists are identical in ``a`` and ``b``."""
    pairs = [(a[s].get(q, [])[:depth], b[s].get(q, [])[:depth]) for s in SPLITS for q in b[s]]
    return round(sum(x == y for x, y in pairs) / max(1, len(pairs)), 4)


def next_mapping(mapping: dict, step: Step, end: dict) -> dict:
    if not step.keys and not step.drop:
        return copy.deepcopy(end)
    target = {k: v for k, v in mapping.items() if k not in step.drop}
    return {**target, **step.keys}


def diff(before: dict, after: dict) -> dict:
    """What ``after`` changes: its keys whose value differs, and the keys it drops (as None)."""
    changed = {k: v for k, v in after.items() if before.get(k) != v}
    return {**changed, **{k: None for k in before if k not in after}}


class Rows:
    """A walk's rows: their records (means) and per-question values, in order."""

    def __init__(self, ws: Workspace) -> None:
        self.ws, self.records, self.values, self.reproduces = ws, [], [], {}

    def add(self, label: str, changed: dict, runs: dict, seconds: float | None = None) -> None:
        values = scores(runs, self.ws.qrels)
        means = {s: {m: round(sum(v) / len(v), 4) for m, v in values[s].items()} for s in SPLITS}
        self.records.append({"change": label, "keys": changed, **means, "train_seconds": seconds})
        self.values.append(values)

    def test(self) -> str:
        """Each row's change against the row before, test split, Holm over the walk."""
        from lexgraph.metrics.significance import holm_adjust, paired_randomization_test

        tests = [
            (
                i,
                m,
                paired_randomization_test(
                    self.values[i]["test"][m],
                    self.values[i - 1]["test"][m],
                    n_resamples=RESAMPLES,
                    seed=self.ws.base.seed,
                ),
            )
            for i in range(1, len(self.values))
            for m in METRICS
        ]
        for (i, m, p), q in zip(tests, holm_adjust([p for _, _, p in tests])):
            self.records[i].setdefault("p_raw", {})[m] = round(p, 4)
            self.records[i].setdefault("p_holm", {})[m] = round(q, 4)
        return f"Holm over the walk's {len(tests)} tests (rows after the first x {len(METRICS)} metrics, test split)"

    def versus(self, row: int, baselines: dict[str, dict]) -> dict:
        """Row ``row`` against each baseline's default runs (test split, Holm over these tests): for a
        start that the default run does not hold, so metrics/significance.json has no test of it."""
        from lexgraph.metrics.significance import holm_adjust, paired_randomization_test

        tests = []
        for name, runs in baselines.items():
            values = scores(runs, self.ws.qrels)["test"]
            for m in METRICS:
                mine = self.values[row]["test"][m]
                p = paired_randomization_test(mine, values[m], n_resamples=RESAMPLES, seed=self.ws.base.seed)
                tests.append((name, m, round(sum(mine) / len(mine) - sum(values[m]) / len(values[m]), 4), p))
        out: dict = {}
        for (name, m, d, p), q in zip(tests, holm_adjust([t[3] for t in tests])):
            out.setdefault(name, {})[m] = {"diff": d, "p_raw": round(p, 4), "p_holm": round(q, 4)}
        return out


def train(ws: Workspace, walk: Walk, mapping: dict, first_stage: bool = False) -> float:
    start = time.perf_counter()
    if walk.section == "gnn":
        ws.train_gnn(walk.start, mapping, first_stage)
    else:
        ws.train_rerank(walk.start, mapping)
    return round(time.perf_counter() - start, 1)


def run_walk(name: str, walk: Walk, ws: Workspace) -> dict:
    """Every row of ``walk``: its changed keys, dev and test means, the paired test of its change."""
    ws.reset()
    rows = Rows(ws)
    mapping = ws.mapping(walk.section, walk.start)
    if walk.first_stage_row:  # the paper profile's own first stage, trained here
        start = time.perf_counter()
        ws.train_first_stage()
        seconds = round(time.perf_counter() - start, 1) + train(ws, walk, mapping, first_stage=True)
        rows.add(
            f"{walk.start} with its own first stage (a dot-product DSR, as the paper profile)",
            {},
            ws.runs(walk.start),
            seconds,
        )
    if walk.default_start:
        seconds = train(ws, walk, mapping)  # retrained here: it must give the default run's runs
        rows.reproduces[walk.start] = same_runs(ws.runs(walk.start), ws.default_runs(walk.start))
        label = f"{walk.start} (the default run)" + (": G-DSR's DSR as its first stage" if walk.first_stage_row else "")
        rows.add(
            label, {"first_stage": "models/dsr"} if walk.first_stage_row else {}, ws.default_runs(walk.start), seconds
        )
    else:
        mapping = {**mapping, "enabled": True}
        seconds = train(ws, walk, mapping)
        rows.add(f"{walk.start} as published (trained here: off in the default run)", {}, ws.runs(walk.start), seconds)
        versus = rows.versus(0, {b: ws.default_runs(b) for b in BASELINES})
    end = {**ws.mapping(walk.section, walk.end)}
    for step in walk.steps:
        target = next_mapping(mapping, step, end)
        changed, mapping = diff(mapping, target), target
        log.info("%s: %s %s", name, step.label, changed)
        seconds = train(ws, walk, mapping)
        runs = ws.runs(walk.start)
        if step is walk.steps[-1]:  # the end: the default run's own system, retrained here
            rows.reproduces[walk.end] = same_runs(runs, ws.default_runs(walk.end))
            runs = ws.default_runs(walk.end)
            step = Step(f"{step.label} = {walk.end} (the default run)")
        rows.add(step.label, changed, runs, seconds)
    family = rows.test()
    record = {"start": walk.start, "end": walk.end, "rows": rows.records, "reproduces": rows.reproduces}
    record["machine"] = machine()
    if not walk.default_start:  # no test of it in metrics/significance.json: against the baselines here
        record["versus"] = versus
    return {**record, "family": family}


def main(argv=None) -> int:
    from lexgraph.core.arguments import OneLineParser

    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("."))
    parser.add_argument("--walks", nargs="*", choices=sorted(WALKS), default=sorted(WALKS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from lexgraph.core.errors import LexgraphError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for noisy in ("lexgraph", "transformers"):  # the rows' models keep no provenance record: that warning is noise here
        logging.getLogger(noisy).setLevel(logging.ERROR)
    logging.getLogger("lexgraph.core.progress").setLevel(logging.INFO)  # a long row says where it is
    try:  # a missing artefact, table or params key is one line naming it, as in the stages
        with tempfile.TemporaryDirectory(prefix="walk-") as scratch:
            ws = Workspace(args.workspace.resolve(), Path(scratch))
            walks = {}
            for name in args.walks:
                walks[name] = run_walk(name, WALKS[name], ws)
                write(args.json, walks, ws)  # each walk as soon as it is done
    except LexgraphError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    if not args.json:
        sys.stdout.write(json.dumps(walks, indent=1) + "\n")
    return 0


def machine() -> str:
    """This machine's cores and CPU model, and torch's threads in this run."""
    import torch

    from lexgraph.core.machine import describe

    return describe(torch.get_num_threads())


def write(path: Path | None, walks: dict, ws: Workspace) -> None:
    """Merge ``walks`` into the JSON at ``path`` (the walks not run keep their earlier record)."""
    if path is None:
        return
    from lexgraph.core.io import write_json

    previous = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    merged = {
        "walks": {**previous.get("walks", {}), **walks},
        "metrics": list(METRICS),
        "splits": list(SPLITS),
        "resamples": RESAMPLES,
        "seed": ws.base.seed,
        "machine": machine(),
    }
    write_json(merged, path)


if __name__ == "__main__":
    sys.exit(main())
