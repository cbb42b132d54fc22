"""A stop request (Ctrl-C, SIGTERM) that takes effect between training steps, in every process at once.

Raising KeyboardInterrupt wherever the signal lands could leave the optimizer stepped but the step not
counted, or one process inside a gradient all-reduce that its peers have left. Instead the signal
sets a flag; after each step the processes agree (any flag set: all stop), save, and stop.
"""

import signal
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    def __init__(self):
        self.requested = False

    def _handle(self, signum, frame):
        self.requested = True  # repeats are ignored: a launcher forwards the terminal's Ctrl-C once more

    @contextmanager
    def installed(self):
        """Within: SIGINT and SIGTERM set the flag instead of interrupting."""
        previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
