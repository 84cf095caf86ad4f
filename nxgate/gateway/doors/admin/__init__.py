"""Administration: the gateway's root-only socket and ``nxgate-admin``."""
