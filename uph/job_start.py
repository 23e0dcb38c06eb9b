"""What a workflow job does before anything else: every workflow script's first import (workflow_scripts/),
made for its effect. It makes a Ctrl-C end the job with status 130 and no traceback, even while the script's
other imports (torch's seconds of them) run: uph.errors.quiet_interrupts. And it caps torch's CPU kernels as
config `cpu_kernels` says, before torch is imported (uph.device.cap_cpu_kernels), and keeps freed memory in
the heap for the next tensor (uph.heap.keep_freed_memory). Outside a workflow job it does nothing."""

from uph.device import cap_cpu_kernels
from uph.errors import quiet_interrupts, workflow_job
from uph.heap import keep_freed_memory

quiet_interrupts()
if (job := workflow_job()) is not None:
    cap_cpu_kernels(getattr(job, "config", None) or {})
    keep_freed_memory()
