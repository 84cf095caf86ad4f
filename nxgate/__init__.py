"""nxgate: an NX 3 remote desktop gateway on Twisted."""

__version__ = "0.1.0"
