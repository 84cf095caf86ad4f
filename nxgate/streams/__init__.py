"""Byte streams: joined, relayed and reached, on this machine or another member's.

``splice`` (two streams joined with back-pressure and half-close: every relay uses it), ``relay``
(a door's channel to a session's stream), ``agentsocket`` (an agent's Unix socket reached safely, and
the local ``Stream``), ``tcp`` (socket options), ``guarded`` (the "authenticated" word to the
connection guard), ``heap`` (how a process that relays bulk streams asks malloc to keep its
memory), and what a session sends back to its client: ``reverse`` (pure: the reverse
services, their stream kinds, the route's lines), ``reverse_route`` (a door's end of a route),
``reverse_channel`` (the SSH channel that carries one reverse stream).

It imports no door, no node, no client program and no store (rule L13): the node, the doors and
``nxgate-client`` all use it.
"""
