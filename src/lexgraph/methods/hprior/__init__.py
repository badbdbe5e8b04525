"""lexgraph's parameter-free ``hprior``: DSR's article vectors propagated through the hierarchy."""
