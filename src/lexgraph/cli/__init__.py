"""The `lexgraph` command: search, batch files, regression checks."""
