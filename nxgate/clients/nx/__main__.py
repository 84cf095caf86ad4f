"""``python -m nxgate.clients.nx``."""

import sys

from nxgate.clients.nx.main import main

sys.exit(main())
