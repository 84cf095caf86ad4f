"""Shadowing: watching, or helping in, a running session or the local console."""
