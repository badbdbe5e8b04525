"""encode_chunks: chunk every article and heading for the hierarchical article encoder and,
with a frozen chunk encoder (dsr.chunk_encoder: frozen), cache their chunk vectors.

Reads the chunking keys of the `dsr` section (chunk_encoder, max_chunk_length,
max_document_length, token_pooling, eval_batch_size); dvc.yaml tracks exactly those.
"""

from __future__ import annotations

import sys

from lexgraph.core.stage import Stage, run_stage
from lexgraph.encoding.chunks import EncodeChunksPaths, run_encode_chunks
from lexgraph.methods.dsr.config import DSRConfig

STAGE = Stage("encode_chunks", "dsr", EncodeChunksPaths, DSRConfig.from_params, run_encode_chunks)

if __name__ == "__main__":
    sys.exit(run_stage(STAGE))
