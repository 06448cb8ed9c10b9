"""`repro matrix`: restart a deployment per combination of server features, run the same load on each,
and name with statistics the feature (or interaction) that causes corruption.

spec (YAML → validated model) → design (cells, run order) → deploy (launch, readiness, confirmation)
→ runner (the loop, matrix directory, resume) → analysis (per-factor tests, verdicts) → report.
"""
