"""The session service: what every front door (the NX shell over Conch or
OpenSSH, the admin socket, later a browser and D-Bus) asks of sessions.

``caller``, ``errors``, ``requests``, ``results`` and ``api`` are its
vocabulary: plain, pure types with no NX wire text and no Twisted.  Only
``nxgate.nx`` turns them into ``NX>`` lines; the admin socket into JSON.
"""
