"""What runs a session: nxagent (and, later, shadow and RDP/VNC proxies)."""
