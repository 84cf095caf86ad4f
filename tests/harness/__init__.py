"""Helpers for end-to-end tests that drive the real programs.

They run the real gateway (``twistd nxgate``) as a separate process, create
real Unix users for PAM, and talk to the gateway with the real OpenSSH
client exactly as nxclient's nxssh does.  Everything is started with argv
lists (no shell) and cleaned up by the test that started it.
"""
