"""Domain-adaptive MLM pre-training of the base checkpoint (the ``pretrain`` stage)."""
