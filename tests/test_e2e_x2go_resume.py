"""End to end: a resume with X2Go's client as a new user runs it (its default link).

pyhoca-cli asks for ``adsl`` unless told otherwise.  On such a link nxcomp
saves its message caches when the link ends, and a resume that loads the one
saved at the suspend waits in nx-libs' reconnection for nxcomp's ping timeout
or the first signal (3.6 s of every resume) before the session is back
(nxgate.node.agents.nxagent.cache_directory).  The gateway drops the saved
caches before the resume: the agent's log of the resume says it found none,
and the session is drawn again.  Timings stay in bench/x2go.py.
"""

from __future__ import annotations

import os

from tests.harness.process import stop, wait_for
from tests.test_e2e_x2go import X2GoCase


class DefaultLinkResumeTests(X2GoCase):
    def saved_caches(self, session_id: str) -> list[str]:
        directory = os.path.join(self.gateway.state_dir, "sessions", session_id, "cache-console")
        return sorted(os.listdir(directory)) if os.path.isdir(directory) else []

    def resume_log(self, session_id: str) -> str:
        """The agent's log since its last resume began."""
        with open(os.path.join(self.gateway.state_dir, "logs", f"{session_id}.agent.log"), errors="replace") as log:
            text = log.read()
        return text[text.rindex("Session: Resuming session"):]

    def test_a_resume_over_the_clients_default_link_loads_no_saved_cache(self):
        client, log = self.session_client("-c", "TERMINAL", "-g", "800x600")  # no -q: pyhoca-cli's adsl
        name = self.started_name(client, log)
        self.assertGreaterEqual(self.window_equal(name, f"{self.user.name}@"), 0.99)
        session_id = self.session_id(name)
        suspended = self.cli("-S", name)
        self.assertEqual(suspended.returncode, 0, suspended.stdout + suspended.stderr)
        wait_for(lambda: self.listed().get(name) == "S", 30, "the session listed as suspended")
        stop(client)
        # The link saved its caches (else this test would prove nothing).
        self.assertTrue(self.saved_caches(session_id), "nxcomp saved no cache at the suspend")

        resumed, log = self.session_client("-R", name, "-g", "800x600")
        self.assertEqual(self.started_name(resumed, log), name)
        self.assertGreaterEqual(self.window_equal(name, f"{self.user.name}@"), 0.99)
        wait_for(lambda: "Session: Session resumed" in self.resume_log(session_id), 60, "the agent's resume")
        said = self.resume_log(session_id)
        self.assertIn("Info: No suitable cache file found.", said)
        self.assertNotIn("Using cache file", said)
        self.assertEqual(self.listed().get(name), "R")
