"""The session store: one SQL implementation for SQLite, PostgreSQL and MariaDB, off the reactor."""
