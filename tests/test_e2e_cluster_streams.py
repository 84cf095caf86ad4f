"""End to end: a node checks every stream it is asked for, as it checks every call.

A gateway-only member and a node share PostgreSQL; a user starts a session
through the gateway's SSH door (a real NX login; the agent runs on the
node).  Then this test is a gateway of the cluster (a certificate of the
cluster's CA for the gateway's name, as the gateway's own) and asks the
node's listener for streams of that session the way a gateway's router
does (``open_stream`` on a :class:`nxgate.wire.remote_node.RemoteNode`):

* for another user (a real account of the node's): refused, NOT_YOURS with
  NOT_FOUND's words, and the agent sees no connection (it would abort on a
  stranger's handshake);
* of a kind the node does not know: refused with words;
* of a session id the node does not run, and of the session once it has
  ended: NOT_FOUND;

and the session's own client still attaches through the gateway after all
that, and sees its screen.

Before streams went through the node interface, the node's stream endpoint
took a bare session id from any gateway and connected it to the agent.
"""

from __future__ import annotations

import os

from twisted.internet import defer, reactor

from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.streams import AGENT, VIEW, StreamKind
from nxgate.wire.remote_node import RemoteNode
from nxgate.wire.tls import ClusterTLS
from tests.harness.process import wait_for
from tests.harness.users import create_user
from tests.test_e2e_cluster import ClusterTestCase


class NodeStreamRefusalTests(ClusterTestCase):
    def as_gateway(self, name: str, node_name: str, address: str) -> RemoteNode:
        """This test as gateway ``name`` of the cluster, speaking to member ``node_name``."""
        cert, key = self.cluster.certificate(name)
        tls = ClusterTLS.load(name, os.path.join(self.cluster.ca, "ca", "ca.pem"), cert, key)
        node = RemoteNode(reactor, tls, node_name, address)
        self.addCleanup(node.close)
        return node

    @defer.inlineCallbacks
    def refused(self, node: RemoteNode, caller: Caller, session_id: str, kind: StreamKind = AGENT):
        error = yield self.assertFailure(defer.ensureDeferred(node.open_stream(caller, session_id, kind)),
                                         SessionError)
        return error

    @defer.inlineCallbacks
    def test_the_node_refuses_streams_of_others_unknown_kinds_and_ended_sessions(self):
        gateway, node_member = self.members(("gw-a", "gateway"), ("node-b", "node"))
        client, info = self.start(gateway, "streams")
        session_id = info.session_id
        self.assertEqual(self.sessions(gateway)[session_id]["node"], "node-b")
        other = create_user()
        self.addCleanup(other.remove)
        owner = Caller(self.user.name, address="192.0.2.10", door="nx-conch")
        stranger = Caller(other.name, address="192.0.2.11", door="nx-conch")
        node = self.as_gateway("gw-a", "node-b", node_member.address)

        for kind in (AGENT, VIEW):
            error = yield self.refused(node, stranger, session_id, kind)
            self.assertEqual((error.kind, error.message), (Kind.NOT_YOURS, f"Could not find session {session_id}."))
        self.assertIn(f"{other.name} from 192.0.2.11 asked for session {session_id} of another user",
                      node_member.log())

        error = yield self.refused(node, owner, session_id, StreamKind("accept", 1))
        self.assertEqual((error.kind, error.message),
                         (Kind.INVALID_REQUEST, "Machine node-b opens no stream of kind accept 1."))

        error = yield self.refused(node, owner, "F" * 32)
        self.assertEqual((error.kind, error.message), (Kind.NOT_FOUND, f"Could not find session {'F' * 32}."))

        # Nothing reached the agent (a stranger's handshake would have made it abort): its own
        # client attaches through the gateway, and sees the session's screen.
        screen = self.screen()
        attachment = self.attach(client, info, screen, gateway)
        self.assert_picture(screen, node_member, info)
        attachment.detach()
        gateway.admin("terminate", session_id)
        wait_for(lambda: session_id not in self.sessions(gateway), 60, "the session's end")
        error = yield self.refused(node, owner, session_id)
        self.assertEqual((error.kind, error.message), (Kind.NOT_FOUND, f"Could not find session {session_id}."))
