"""The built-in SSH server (Twisted Conch) that NX clients reach."""
