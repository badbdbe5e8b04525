"""The re-rankers: MVCL as published (``mvcl``) and lexgraph's ``xrerank`` (settings, the frozen
PLM's token states, model, training loop, stage entry, systems)."""
