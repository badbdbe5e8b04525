"""The retrieval methods, one folder each: its config, data, model, training, stage entry and
system declaration together (docs/architecture.md). ``system.py`` says what a declaration holds,
``catalog.py`` collects every declaration, ``dense.py`` is the dense systems' shared retriever."""
