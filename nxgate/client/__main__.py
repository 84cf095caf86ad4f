"""``python -m nxgate.client``."""

import sys

from nxgate.client.main import main

sys.exit(main())
