"""The graph encoders: G-DSR's LGE, QABISAR's and lexgraph's ``hgraph``/``hgraph_qa`` (settings,
graph data, model, training loop, stage entry, inductive use on a new corpus, systems)."""
