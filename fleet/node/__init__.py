"""The node side in Python: what a node reports (facts), what fleet decides from it, and what
it asks the node to do (actions), with fleet/remote's sh on the node itself.

May import: fleet.core only. The decisions stay pure: nothing of SSH, the output, click, rich or
paramiko (an import-linter contract checks it).
"""
