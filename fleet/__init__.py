"""fleet: clean, launch and babysit multi-node GPU training over SSH."""

__version__ = "0.1.0"
