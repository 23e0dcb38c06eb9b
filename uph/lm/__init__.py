"""User prior heads on a frozen causal LM: corpus, model, hidden-state cache, heads, fitting, evaluation."""
