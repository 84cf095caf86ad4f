"""Work on this machine's operating system that the node and the gateway's logins both do.

PAM (``pamlib``), programs started as a user (``runas``, the small root-to-user exec helper, and
``launcher``, which keeps spare ones ready), processes (``processes``: pidfd exit watches and
signals), files in users' directories and the state layout (``files``), who is at the other end of
a local connection (``peercred``, ``local_peers``), the process's open files (``descriptors``) and
account look-ups (``users``).  Nothing here knows about sessions' life cycles, doors, the cluster or
client programs: it imports no ``node``, ``gateway``, ``wire``, ``streams`` or ``clients`` (rule L14
of tests/test_layering.py), so the gateway's logins use it without reaching into the node.
"""
