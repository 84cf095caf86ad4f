"""X2Go clients on nxgate's own SSH port: a strict reader of their exec programs,
X2Go names for every session, and the Conch wiring."""
