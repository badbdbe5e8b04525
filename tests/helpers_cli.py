"""A three-article BM25 workspace's corpus for the `lexgraph search` error tests
(test_cli_errors, test_params_errors)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from lexgraph.data.keys import keys_table

ARTICLES = {
    1: "Le propriétaire du mur mitoyen paie la réparation du mur.",
    2: "Le bail est un contrat de louage de choses.",
    3: "Le locataire paie le loyer au bailleur.",
}


def write_articles(root: Path, articles: dict[int, str]) -> None:
    (root / "data" / "clean").mkdir(parents=True, exist_ok=True)
    pl.DataFrame(
        {
            "id": list(articles),
            "article": list(articles.values()),
            "reference": [f"Art. {i}" for i in articles],
            "path": [["Code A"]] * len(articles),
        }
    ).write_parquet(root / "data" / "clean" / "articles.parquet")
    keys_table([], []).write_parquet(root / "data" / "clean" / "keys.parquet")  # as clean writes it: no rows
