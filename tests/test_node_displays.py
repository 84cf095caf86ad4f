"""Display claims between gateways on one machine (nxgate.node.displays)."""

from __future__ import annotations

import subprocess
import sys
import tempfile

from twisted.trial.unittest import TestCase

from nxgate.node import displays


CLAIM_IN_ANOTHER_PROCESS = """
import sys
from nxgate.node import displays
sys.exit(0 if displays.claim_display(int(sys.argv[1]), sys.argv[2]) else 3)
"""


class DisplayClaimTests(TestCase):
    def setUp(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="nxgate-claims-")
        self.addCleanup(subprocess.run, ["rm", "-rf", self.directory], check=False)

    def other_process_claims(self, display: int) -> bool:
        result = subprocess.run([sys.executable, "-c", CLAIM_IN_ANOTHER_PROCESS, str(display), self.directory],
                                check=False)
        self.assertIn(result.returncode, (0, 3))
        return result.returncode == 0

    def test_a_claimed_display_cannot_be_claimed_by_another_gateway(self) -> None:
        self.assertTrue(displays.claim_display(7301, self.directory))
        self.addCleanup(displays.release_display, 7301)
        self.assertFalse(self.other_process_claims(7301))
        self.assertTrue(self.other_process_claims(7302))

    def test_a_released_display_can_be_claimed_again(self) -> None:
        self.assertTrue(displays.claim_display(7303, self.directory))
        displays.release_display(7303)
        self.assertTrue(self.other_process_claims(7303))

    def test_the_same_gateway_may_claim_its_own_display_again(self) -> None:
        self.assertTrue(displays.claim_display(7304, self.directory))
        self.addCleanup(displays.release_display, 7304)
        self.assertTrue(displays.claim_display(7304, self.directory))
