"""The twistd plugin: ``twistd nxgate`` (the real work is in nxgate.tap)."""

from twisted.application.service import ServiceMaker

nxgate = ServiceMaker("nxgate", "nxgate.tap", "NX remote desktop gateway (SSH + NX protocol)", "nxgate")
