"""The fitting engine: heads, tokens, the objective and its rounds, solvers, lockstep, capacity, evaluation,
the baselines and the neural cache (imports uph.lm.data, never uph.lm.jobs)."""
