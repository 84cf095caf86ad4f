"""Logins at the doors: PAM conversations off the reactor, the throttle, peer credentials."""
