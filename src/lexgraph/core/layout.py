"""The workspace layout: where each artefact of ``dvc repro`` lives and which stage writes it.

Stage scripts take every path on their command line, so ``dvc.yaml`` is the only place a
stage's own inputs and outputs are written. The readers of a finished workspace (the
system loaders behind ``lexgraph search`` and ``evaluate``, the CLI's guards) find the
artefacts here; ``tests/test_layout.py`` checks every entry against ``dvc.yaml``'s outs.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

from lexgraph.core.provenance import Input, Output, Role, Workspace


@dataclass(frozen=True)
class Artifact:
    """An output of ``stage`` (a ``dvc.yaml`` stage name, ``name@item`` for a foreach entry),
    at ``path`` relative to the workspace (a file, or a directory DVC tracks whole)."""

    path: PurePosixPath
    stage: str

    def __init__(self, path: str, stage: str) -> None:
        object.__setattr__(self, "path", PurePosixPath(path))
        object.__setattr__(self, "stage", stage)

    def under(self, workspace: str | Path, *parts: str) -> Path:
        """``workspace / path / parts``: the artefact (or a file inside it) in a workspace."""
        return Path(workspace, *self.path.parts, *parts)

    def posix(self, *parts: str) -> str:
        """The artefact's (or a file inside it) path relative to a workspace, as records write it."""
        return PurePosixPath(self.path, *parts).as_posix()


#: the embedded sample, the ``sample`` source's input (``fetch.sample_dir``; a dvc.yaml dep, not an output)
SAMPLE = PurePosixPath("data/sample")
#: the user's corpus and questions files (``fetch.corpus_file``, ``fetch.questions_file``) lie in this
#: folder, fetch's dvc.yaml dep: editing one reruns fetch and what follows
CORPUS = PurePosixPath("data/corpus")

#: the file a graph encoder or the hierarchy prior writes its final article vectors to (in its model directory)
ARTICLE_EMBEDDINGS = "article_embeddings.safetensors"

RAW = Artifact("data/raw", "fetch")
CLEAN = Artifact("data/clean", "clean")  # articles.parquet, headings.parquet, questions.parquet
BM25 = Artifact("models/bm25", "bm25")
PRETRAIN = Artifact("models/pretrain", "pretrain")
SYNTHETIC = Artifact("data/queries/synthetic.parquet", "generate_queries")
NEGATIVES = Artifact("data/negatives/negatives.parquet", "mine_negatives")
ZEROSHOT = Artifact("data/zeroshot", "zeroshot")
CHUNKS = Artifact("data/chunks", "encode_chunks")
DSR = Artifact("models/dsr", "train_dsr")
EMBED = Artifact("data/embed", "embed")
#: QABISAR's own first stage (dot product, no synthetic pairs) and its vectors: train_gnn@qabisar's
#: inputs (placeholders with ``dsr_qabisar.enabled: false``; qabisar then starts from DSR and EMBED)
DSR_QABISAR = Artifact("models/dsr_qabisar", "train_dsr_qabisar")
EMBED_QABISAR = Artifact("data/embed_qabisar", "embed_qabisar")
GRAPH = Artifact("data/graph", "build_graph")
HPRIOR = Artifact("models/hprior", "hprior")
#: train_gnn's variants: the papers as published (gdsr, qabisar) and lexgraph's recipes (hgraph, hgraph_qa)
GNN = {
    variant: Artifact(f"models/gnn_{variant}", f"train_gnn@{variant}")
    for variant in ("gdsr", "qabisar", "hgraph", "hgraph_qa")
}
#: the variants whose graph holds the train questions (their query encoders are their own, distilled)
QUESTION_VARIANTS = ("qabisar", "hgraph_qa")
HYBRID = Artifact("models/hybrid", "hybrid")
RERANK_FEATURES = Artifact("data/rerank", "encode_rerank")
RERANKERS = {variant: Artifact(f"models/{variant}", f"rerank@{variant}") for variant in ("xrerank", "mvcl")}
RUNS = Artifact("data/runs", "evaluate")

#: every artefact above, by name (the layout test walks it)
ARTIFACTS: dict[str, Artifact] = {
    "raw": RAW,
    "clean": CLEAN,
    "bm25": BM25,
    "pretrain": PRETRAIN,
    "synthetic": SYNTHETIC,
    "negatives": NEGATIVES,
    "zeroshot": ZEROSHOT,
    "chunks": CHUNKS,
    "dsr": DSR,
    "embed": EMBED,
    "dsr_qabisar": DSR_QABISAR,
    "embed_qabisar": EMBED_QABISAR,
    "graph": GRAPH,
    "hprior": HPRIOR,
    **{f"gnn_{v}": a for v, a in GNN.items()},
    "hybrid": HYBRID,
    "rerank_features": RERANK_FEATURES,
    **RERANKERS,
    "runs": RUNS,
}

#: a stage table entry's role key (the first key of a path's entry in ``stages.toml``)
ROLE_KEYS: dict[str, type[Role]] = {"in": Input, "out": Output, "workspace": Workspace}


def read_stage_table(text: str) -> tuple[dict[str, Role], dict[str, dict[str, Role]]]:
    """The stage table's common paths and each stage's paths (common ones first), with their marks
    (``text``: ``stages.toml``, whose header says its form)."""
    table = tomllib.loads(text)

    def role(entry: dict[str, Any]) -> Role:
        (key, help_), *options = entry.items()
        return ROLE_KEYS[key](help_, **dict(options))

    common = {name: role(entry) for name, entry in table["common"].items()}
    stages: dict[str, dict[str, Role]] = {}
    for stage, entry in table["stage"].items():
        unknown = set(entry.get("common", ())) - common.keys()
        if unknown:
            raise ValueError(f"stages.toml: stage {stage!r} names {sorted(unknown)}, not paths of [common]")
        own = {name: role(mark) for name, mark in entry.items() if name != "common"}
        stages[stage] = {**{name: common[name] for name in entry.get("common", ())}, **own}
    return common, stages


#: the paths many stages name (``PATHS``) and every stage's paths (``STAGE_PATHS``), by their
#: ``--option``, each role and help written once in the stage table ``stages.toml``
#: (:func:`lexgraph.core.stage.stage_paths` builds a stage's paths dataclass from its entry)
PATHS, STAGE_PATHS = read_stage_table(resources.files(__package__).joinpath("stages.toml").read_text("utf-8"))

#: the workspace directories `dvc repro` manages (nothing else may write under them)
MANAGED_ROOTS: tuple[str, ...] = ("data", "models")


def articles(workspace: str | Path = ".") -> Path:
    """The clean articles table of a workspace (what every system must have been built on)."""
    return CLEAN.under(workspace, "articles.parquet")


def producer(path: str | Path) -> Artifact | None:
    """The artefact that ``path`` is or lies in, recognised by the artefact's relative path
    anywhere in ``path`` (the rightmost match, the longest on a tie); ``None`` outside the
    layout (e.g. a checkpoint directory a user named in params.yaml)."""
    parts = Path(path).parts  # not resolved: a symbolic link loop must not fail here
    best: tuple[tuple[int, int], Artifact] | None = None
    for artifact in ARTIFACTS.values():
        n = len(artifact.path.parts)
        for start in range(len(parts) - n, -1, -1):
            if parts[start : start + n] == artifact.path.parts:
                if best is None or (start, n) > best[0]:
                    best = ((start, n), artifact)
                break
    return best[1] if best else None


def restore_hint(path: str | Path) -> str:
    """What to do about a missing or damaged artefact file: rerun the stage that writes it."""
    artifact = producer(path)
    stage = f" {artifact.stage}" if artifact else ""
    return f"rerun `dvc repro{stage}` (or `dvc checkout`) to restore it"
