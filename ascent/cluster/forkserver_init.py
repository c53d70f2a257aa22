"""Imported in the fork server that starts every host process (`ascent.cluster.hosts`), before anything else.

A SIGTERM to a whole job (Slurm's preemption signals every process of the job step; `timeout` and
`kill -- -PGID` signal the process group) must reach the controller alone: it stops the run at its next safe
point and writes a checkpoint, and it ends its hosts itself (SIGKILL). The standard library's fork server
ignores SIGINT for the same reason, but dies of SIGTERM, and with it every host's link to the controller:
each call then out fails ("exit code 255") and the iteration the controller finishes fails its rewards. So
the fork server, and the hosts it forks (they inherit the handler), let SIGTERM pass. A Python handler, not
SIG_IGN: processes that user code execs get the default SIGTERM back.
"""

from __future__ import annotations

import signal


def _let_pass(signum: int, frame: object) -> None:
    """SIGTERM is the controller's to act on."""


signal.signal(signal.SIGTERM, _let_pass)
