"""The session vocabulary every part speaks: callers, errors, requests, results, the
session model and its events, the session API and the node interface.  Pure: no
Twisted, no I/O; it imports nothing else of nxgate."""
