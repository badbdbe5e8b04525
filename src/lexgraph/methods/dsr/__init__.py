"""DSR, G-DSR's dense statute retriever (query encoder and hierarchical article encoder): its
settings, training pairs, hard negatives, training loop and the ``dsr`` system."""
