"""One run, end to end: every command rendered into a Plan before anything connects, a bounded
pool of workers executing it over a transport, events fanned out to the reporters and the run
record, a RunSummary at the end. Also an op step run against this machine's own shell (tests).

May import: fleet.core, fleet.inventory, fleet.node, fleet.ssh, fleet.output, fleet.records.
"""
