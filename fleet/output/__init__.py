"""What the operator sees: events turned into a live table, plain lines or JSON lines, and the
hosts' outputs gathered. The only package that imports rich (with fleet.cli for its console).

May import: fleet.core, and fleet.node's run states (the status table shows them).
"""
