"""nxgate: an NX 3 remote desktop gateway on Twisted."""

import warnings

__version__ = "0.1.0"

# Conch (Twisted 22.4 with Debian's cryptography) names Blowfish and CAST5
# when it lists ciphers; we never offer them, and the warning would land on
# every nxgate-client's stderr and in every gateway start's log.
warnings.filterwarnings("ignore", message=r"(Blowfish|CAST5) has been deprecated")
