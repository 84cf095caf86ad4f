"""The browser door: an HTTPS portal to the same sessions as NX."""
