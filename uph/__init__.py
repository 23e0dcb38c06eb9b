"""uph: user prior heads, triple-product attention and factored feedback, as a benchmark suite."""

from uph.errors import quiet_interrupts

quiet_interrupts()  # a workflow job stopped by Ctrl-C ends without a traceback (uph.errors)
