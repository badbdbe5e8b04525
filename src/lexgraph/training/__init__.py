"""Training loops (logic behind the train_* stages)."""
