"""The process's own limits: enough open files for the connections a load keeps open."""

from __future__ import annotations

import resource

from repro.errors import UsageError


def ensure_open_files(connections: int) -> None:
    """Raise the open-file limit to fit `connections` sockets (plus the run's files), or say why not."""
    wanted = connections + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            raise UsageError(f"--concurrency {connections} needs {wanted} open files; the hard limit is {hard} (ulimit -Hn)")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
