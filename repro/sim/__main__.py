"""`python -m repro.sim serve [flags]`: the simulator alone, without loading the rest of the CLI."""

from __future__ import annotations

import sys

from repro.errors import EXIT_USAGE, ReproError


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "serve":
        print("usage: python -m repro.sim serve [flags]  (serve --help lists the flags)", file=sys.stderr)
        return EXIT_USAGE
    from repro.sim.config import parse_flags
    from repro.sim.server import serve

    try:
        serve(parse_flags(argv[1:], prog="python -m repro.sim serve"))
    except ReproError as err:
        print(f"repro: error: {err}", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
