"""The cluster's wire: how members talk.

Mutual TLS 1.3 between members (``tls``, ``connection``, ``records``), the AMP calls of the node
interface (``protocol``), a node as a gateway calls it (``remote_node``), a node's listener
(``node_listener``) and a gateway's end of another member's stream (``member_stream``).  Only the
gateway's composition root and the admin tool use it (rule L16 of tests/test_layering.py).
"""
