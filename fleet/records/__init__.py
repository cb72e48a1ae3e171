"""Run records: written for every run (events.jsonl, per-host logs, summary.json) and read back by
`-l @failed` / `@unreachable` / `@FILE`.

May import: fleet.core.
"""
