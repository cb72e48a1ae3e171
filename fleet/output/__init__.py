"""What the operator sees: events turned into a live table, plain lines or JSON lines, and the
hosts' outputs gathered. Rendering with rich happens here (reporters.py; plain.py's reports reach
it through a Printer, and off a terminal never load it); above it, rich is only asked for a
Console to hand to these reporters (and fleet.cli's two tables).

May import: fleet.core, and fleet.node's run states (the status table shows them).
"""
