"""Factored feedback on the Stiefel manifold: the update rule, the character LM and its training."""
