"""`repro bisect`: find the commit or the settings that make the corruption appear, on a flaky signal.

`posterior` and `ddmin` are the pure decisions (which commit is to blame, what to probe next, when
to stop); `probe` runs one probe (a deployment plus load rounds); `executor` runs the probes here or
as Ray tasks, several at once; `journal` keeps every probe on disk so an interrupted bisection
resumes; `commits` and `flags` are the two searches; `report` renders them.
"""
