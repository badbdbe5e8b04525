"""The legislative graph: article and heading nodes, typed edges, the hierarchy and its ancestors."""
