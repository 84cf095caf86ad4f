"""The node: what runs sessions on this machine, reached through its LocalNode (the node interface)."""
