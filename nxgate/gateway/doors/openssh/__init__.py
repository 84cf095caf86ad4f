"""The OpenSSH deployment mode: nxgate-shell as the nx account's shell, and the gateway's socket for it."""
