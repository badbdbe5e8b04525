"""Neural models: encoders (DSR), domain-adaptive pre-training, GNNs."""
