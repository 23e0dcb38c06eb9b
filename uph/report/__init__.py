"""The study's figures, summary and provenance, drawn from its tables alone."""
