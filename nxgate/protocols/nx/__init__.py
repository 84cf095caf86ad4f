"""The NX shell protocol: pure parsing, state machine and formatting (no I/O)."""
