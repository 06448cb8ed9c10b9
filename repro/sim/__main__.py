"""`python -m repro.sim serve [flags]`: the same command as `repro sim serve`, without loading the CLI."""

from __future__ import annotations

import sys

from repro.errors import UsageError, run_main
from repro.sim.config import parse_flags
from repro.sim.server import serve


def _serve() -> None:
    args = sys.argv[1:]
    if not args or args[0] != "serve":
        raise UsageError("usage: python -m repro.sim serve [flags] (serve --help lists them)")
    serve(parse_flags(args[1:]))


if __name__ == "__main__":
    run_main(_serve)
