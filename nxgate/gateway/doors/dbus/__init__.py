"""The D-Bus door: ``org.nxgate.Gateway1`` on the system bus."""
