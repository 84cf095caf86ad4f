#!/usr/bin/env python3
"""SSH_ASKPASS helper for tests: prints the password the test put in the environment."""
import os
import sys

sys.stdout.write(os.environ["NXGATE_TEST_PASSWORD"] + "\n")
