"""SSH transport pieces shared by nxgate's Conch server and nxgate-client.

``etm`` (encrypt-then-MAC packet framing) and ``compression`` (delayed zlib and the bounded
inflate).  Both ends of an SSH connection use them, so they import no door, node, cluster or client
program (rule L15 of tests/test_layering.py).
"""
