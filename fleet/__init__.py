"""fleet: clean, launch and babysit multi-node GPU training over SSH.

Packages by concern, each importing only the layers below it (pyproject.toml's import-linter
contracts check it): cli -> ops | sandbox -> engine -> inventory | output | records -> ssh | node
-> core. The README's Layout names every module.
"""

__version__ = "0.1.0"
