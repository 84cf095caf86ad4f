"""Client programs: nxgate-client (NX), the browser viewer and the RDP/VNC engines."""
