"""The data pipeline: the corpus and its splits, the model, the hidden-state cache and the head basis."""
