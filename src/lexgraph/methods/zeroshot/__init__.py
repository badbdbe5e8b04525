"""The base checkpoint as it is, no training: the ``zeroshot`` stage and system."""
