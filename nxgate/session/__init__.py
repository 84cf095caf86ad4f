"""NX sessions: the model, the store, the manager that owns them, and the
launcher that starts session processes as their user."""
