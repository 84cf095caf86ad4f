"""Viewers: draw a remote RDP or VNC desktop inside a session's nxagent
display, one process per session, run as the session's user.  See
:mod:`nxgate.clients.engines.common` for what every engine does."""
