"""Byte streams that are not the cluster's wire: what a session sends back
to its client (:mod:`nxgate.streams.reverse`), and the SSH channel that
carries one such stream to the client (:mod:`nxgate.streams.reverse_channel`).

This package imports no door, no node and no client program: the node
(which listens on the session's machine), the doors (which hold the
client's SSH connection) and ``nxgate-client`` all use it.
"""
