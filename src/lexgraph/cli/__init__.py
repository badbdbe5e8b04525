"""The `lexgraph` command: search, batch files, regression checks, the offline plots page."""
