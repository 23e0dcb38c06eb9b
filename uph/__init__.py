"""uph: user prior heads, triple-product attention and factored feedback, as a benchmark suite."""

from uph.errors import quiet_interrupts
from uph.warm import hand_over

quiet_interrupts()  # a workflow job stopped by Ctrl-C ends without a traceback (uph.errors)
hand_over()  # a GPU job runs in its slot's warm worker where the run has them, and exits (uph.warm)
