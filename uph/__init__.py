"""uph: user prior heads, triple-product attention and factored feedback, as a benchmark suite."""
