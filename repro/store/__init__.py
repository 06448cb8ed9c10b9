"""The run directory: its records, writing and reading it, the summary, and export."""
