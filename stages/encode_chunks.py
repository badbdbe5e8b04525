"""encode_chunks: chunk every article and heading for the hierarchical article encoder and,
with a frozen chunk encoder (dsr.chunk_encoder: frozen), cache their chunk vectors.

Reads the chunking keys of the `dsr` section (chunk_encoder, max_chunk_length,
max_document_length, token_pooling, eval_batch_size); dvc.yaml tracks exactly those.
"""

from __future__ import annotations

import sys

from lexgraph.core.config import resolve_device
from lexgraph.encoding.chunks import run_encode_chunks
from lexgraph.training.dsr_config import DSRConfig


def configure(parser):
    parser.add_argument("--pretrained", required=True, help="base checkpoint (pretrain stage)")
    parser.add_argument("--articles", required=True)
    parser.add_argument("--headings", required=True)
    parser.add_argument("--out", required=True)


def main(args, base, config):
    run_encode_chunks(config, args.pretrained, args.articles, args.headings, args.out, resolve_device(base.device))


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("dsr", main, configure, name="encode_chunks", config=DSRConfig.from_params))
