"""Test helper: has a process group ended? Tests that launch servers assert nothing is left behind."""

import os
import time


def group_gone(pgid: int, timeout: float = 10.0) -> bool:
    """True once no process of the group `pgid` exists; False if some still does after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
