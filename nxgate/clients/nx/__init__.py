"""nxgate-client: a small command-line NX 3 client.

It speaks to an NX server exactly as nxcl, OpenNX and Remmina do (reference
§2, §7): SSH as ``nx`` with the NoMachine key (or legacy-free as the user),
the NX shell dialogue, then ``nxproxy`` drawing the session through the SSH
channel.  ``dialogue`` is the pure protocol core; ``ssh``, ``proxy`` and
``main`` are the thin Twisted parts around it.
"""
