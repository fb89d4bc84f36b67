"""Stopping a long command-line run cleanly: SIGTERM or Ctrl-C asks the run to stop after its current step, and the
run writes the checkpoint its same command resumes from (the job runner passes its own `cancelled` instead)."""
from __future__ import annotations

import signal


def stop_on_signals():
    """Install SIGTERM / SIGINT handlers that only record the request; returns the `cancelled()` the loops poll."""
    asked = []
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: asked.append(True))
    return lambda: bool(asked)
