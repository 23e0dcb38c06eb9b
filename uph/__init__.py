"""uph: user prior heads, triple-product attention and factored feedback, as a benchmark suite.

Importing uph, or any of its modules but uph.job_start, changes nothing outside it."""
