"""zeroshot: embed every article with the base model as it is (E5 prefixes and windowed
mean pooling), for the `zeroshot` retrieval system."""

from __future__ import annotations

import sys

from lexgraph.core.stage import Stage, run_stage
from lexgraph.methods.zeroshot.system import ZeroshotConfig, ZeroshotPaths, run_zeroshot

STAGE = Stage("zeroshot", "zeroshot", ZeroshotPaths, ZeroshotConfig.from_params, run_zeroshot)

if __name__ == "__main__":
    sys.exit(run_stage(STAGE))
