"""The front doors: each turns its own wire into calls of the router (the session API)."""
