"""Neural models (nn.Modules and their weights files): the DSR encoders and backbones, the graph
encoders, the re-ranker's interaction network; e5 conversion."""
