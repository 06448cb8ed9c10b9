"""Processes the harness starts: process groups, capped logs, and the reaper that outlives a killed harness."""
