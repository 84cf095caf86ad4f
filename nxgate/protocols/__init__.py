"""Pure codecs: the NX shell protocol, IPP, the print gate, service channels, WebSocket frames."""
