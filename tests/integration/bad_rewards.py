"""Reward functions for tests of isolation: the row's `answer` says how to misbehave."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any


def score(prompt: str, response: str, response_ids: list[int], metadata: dict[str, Any]) -> float:
    how = metadata["answer"]
    if how == "hang":
        time.sleep(3600)
    elif how == "exit":
        sys.exit(3)
    elif how == "os_exit":
        os._exit(0)
    elif how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "raise":
        raise ValueError("this row's reward is broken")
    elif how == "hog":
        return float(len(bytearray(4 << 30)))  # past reward.memory_limit_mb
    elif how == "loud":
        print("z" * (16 << 20), flush=True)  # past the output a call may print
    return 1.0
