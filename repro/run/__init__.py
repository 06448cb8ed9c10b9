"""One `repro run`: options, target, observation plan, the load, workers, summary and gate."""
