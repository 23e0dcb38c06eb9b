"""What a workflow job does before anything else: every workflow script's first import (workflow_scripts/),
made for its effect. It makes a Ctrl-C end the job with status 130 and no traceback, even while the script's
other imports (torch's seconds of them) run: uph.errors.quiet_interrupts. Outside a workflow job it does
nothing."""

from uph.errors import quiet_interrupts

quiet_interrupts()
