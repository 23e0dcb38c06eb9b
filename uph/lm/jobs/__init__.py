"""The fit stage's jobs: each rule's work from its inputs to its outputs (imports uph.lm.engine and uph.lm.data)."""
