"""The node side in Python: what a node reports (facts), what fleet decides from it, and what
it asks the node to do (actions)."""
