"""The gateway: the doors users come in by, the router every door calls (over the nodes
of a cluster, or the one node of a single box), placement, logins, and the
composition root that builds one ``twistd nxgate``."""
