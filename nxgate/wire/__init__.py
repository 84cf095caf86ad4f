"""What crosses a socket between parts: members' TLS and AMP calls, the streams to agents
(on this machine or another member's), the relays and TCP options."""
