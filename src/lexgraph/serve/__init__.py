"""``lexgraph serve``: the workspace's systems behind an HTTP API and a web page (FastAPI on uvicorn).

Layer: below :mod:`lexgraph.cli` (which starts it) and above :mod:`lexgraph.evaluation` (whose
runs the inspector shows). :mod:`lexgraph.serve.searcher` is also what ``lexgraph search`` uses
to load a system and show its hits, so the server and the command show the same hits.
"""
