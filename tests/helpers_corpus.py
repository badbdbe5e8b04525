"""A corpus of one's own for the tests (``fetch.source: corpus``): 24 articles under a 3-level
heading path with string ids, and 16 questions citing them in train, dev and test."""

from __future__ import annotations

import json
from pathlib import Path

WORDS = "loyer bail vente prix donation mariage divorce succession servitude usufruit hypothèque gage".split()


def corpus_records() -> list[dict]:
    """24 articles under a 3-level path (2 books x 3 titles x 2 chapters, 2 articles each), string ids."""
    out = []
    for book in range(2):
        for title in range(3):
            for chapter in range(2):
                for k in range(2):
                    n = len(out)
                    words = " ".join(WORDS[(n * 7 + j) % len(WORDS)] for j in range(12))
                    out.append(
                        {
                            "id": f"civ:{book}.{title}.{chapter}-{k}",
                            "text": f"Article {n + 1}. Le {words} du titre {title} livre {book}.",
                            "path": [f"Livre {book}", f"Titre {title}", f"Chapitre {chapter}"],
                            "number": str(n + 1),
                            "code": "Code test",
                        }
                    )
    return out


def question_records(articles: list[dict]) -> list[dict]:
    splits = ["train", "train", "dev", "test"]
    return [
        {
            "id": f"q-{i}",
            "question": f"Question {i} : {articles[i % len(articles)]['text'].split('.')[1]} ?",
            "article_ids": [articles[i % len(articles)]["id"], articles[(i + 1) % len(articles)]["id"]],
            "split": splits[i % 4],
        }
        for i in range(16)
    ]


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path
