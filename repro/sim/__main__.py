"""`python -m repro.sim serve [flags]`: the same command as `repro sim serve`."""

from __future__ import annotations

import sys

from repro.cli import main

if __name__ == "__main__":
    sys.argv = ["repro", "sim", *sys.argv[1:]]
    main()
