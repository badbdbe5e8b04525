"""embed: encode articles, heading nodes and questions with the trained DSR
(raw, un-normalised float32 vectors in safetensors files)."""

from __future__ import annotations

import sys

from lexgraph.core.stage import Stage, run_stage
from lexgraph.encoding.embed import EmbedConfig, EmbedPaths, run_embed

STAGE = Stage("embed", "embed", EmbedPaths, EmbedConfig.from_params, run_embed)

if __name__ == "__main__":
    sys.exit(run_stage(STAGE))
