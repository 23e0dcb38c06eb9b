"""User prior heads on a frozen causal LM, in three rooms that import only downwards:

data/    the corpus and its splits, the model, the hidden-state cache and the head basis (corpus -> extract)
engine/  the fitting engine: heads, tokens, the objective and its rounds, solvers, lockstep, capacity,
         evaluation, the baselines and the neural cache
jobs/    the fit stage's jobs, each rule's work from its inputs to its outputs: global fits, validation,
         refits, the controls and the tables (jobs -> engine -> data)
"""
