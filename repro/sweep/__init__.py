"""`repro sweep`: one deployment at several concurrencies, its analysis and its report."""
