"""encode_chunks: chunk every article and heading for the hierarchical article encoder and,
with a frozen chunk encoder (dsr.chunk_encoder: frozen), cache their chunk vectors.

Reads the chunking keys of the `dsr` section (chunk_encoder, max_chunk_length,
max_document_length, token_pooling, eval_batch_size); dvc.yaml tracks exactly those.
"""

from __future__ import annotations

import sys

from lexgraph.core.config import resolve_device
from lexgraph.core.stage import add_paths, paths_from
from lexgraph.encoding.chunks import EncodeChunksPaths, run_encode_chunks
from lexgraph.training.dsr_config import DSRConfig


def configure(parser):
    add_paths(parser, EncodeChunksPaths)


def main(args, base, config):
    paths = paths_from(EncodeChunksPaths, args)
    run_encode_chunks(config, paths.pretrained, paths.articles, paths.headings, paths.out, resolve_device(base.device))


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("dsr", main, configure, name="encode_chunks", config=DSRConfig.from_params))
