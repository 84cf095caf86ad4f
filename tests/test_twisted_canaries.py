"""Canaries for the private parts of Twisted that nxgate relies on (issue 23).

requirements.txt bounds Twisted from above, but a new release inside that
bound may still move a private name.  Each test here names one private API
we override or reach into, and fails loudly, with what to re-check, when it
is gone or changed shape -- instead of a relay, a viewer or the log filter
going quietly wrong.  (Conch's key-exchange hooks have their own canary
beside the transport's tests.)
"""

from __future__ import annotations

import inspect
import os

from twisted.internet.testing import StringTransport
from twisted.logger import globalLogPublisher, textFileLogObserver
from twisted.python import logfile
from twisted.protocols.tls import TLSMemoryBIOProtocol
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http import HTTPChannel

from nxgate.wire import connection


def _parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


class TLSWriteCanary(SynchronousTestCase):
    """nxgate.wire.connection replaces ``TLSMemoryBIOProtocol._write``
    (one TCP write per application write) with Twisted's own private names."""

    def test_the_names_the_override_uses_are_there(self):
        self.assertEqual(_parameters(TLSMemoryBIOProtocol._write), ["self", "bytes"])
        self.assertEqual(_parameters(TLSMemoryBIOProtocol._bufferedWrite), ["self", "octets"])
        self.assertEqual(_parameters(TLSMemoryBIOProtocol._tlsShutdownFinished), ["self", "reason"])
        source = inspect.getsource(TLSMemoryBIOProtocol)
        for name in ("self._lostTLSConnection", "self._tlsConnection"):
            self.assertIn(name, source, f"Twisted's TLS protocol no longer has {name}: re-check "
                                        "nxgate.wire.connection's _write")

    def test_public_writes_still_go_through_write_underscore(self):
        self.assertIn("self._write(", inspect.getsource(TLSMemoryBIOProtocol.write))
        overriding = [cls for cls in vars(connection).values()
                      if isinstance(cls, type) and issubclass(cls, TLSMemoryBIOProtocol) and "_write" in vars(cls)]
        self.assertTrue(overriding, "nxgate.wire.connection no longer overrides _write: remove this canary")


class WebSocketTakeOverCanary(SynchronousTestCase):
    """nxgate.protocols.websocket.upgrade takes a connection away from
    twisted.web: it unregisters the channel as the transport's producer,
    drops its timeout and sets ``channel.transport`` to None."""

    def test_the_channel_registers_itself_as_the_producer(self):
        channel = HTTPChannel()
        transport = StringTransport()
        channel.makeConnection(transport)
        self.assertIs(transport.producer, channel, "twisted.web's channel no longer registers itself as the "
                                                   "connection's producer: re-check websocket.upgrade")
        channel.setTimeout(None)
        transport.unregisterProducer()
        channel.transport = None
        channel.connectionLost(None)  # what a taken-over channel sees at the end must not fail


class LogPublisherCanary(SynchronousTestCase):
    """nxgate.logs.filter_global_log wraps twistd's observers in place
    through ``globalLogPublisher._observers``."""

    def test_the_publisher_keeps_its_observers_in_a_list(self):
        observers = getattr(globalLogPublisher, "_observers", None)
        self.assertIsInstance(observers, list, "twisted.logger's publisher no longer has _observers: "
                                               "re-check nxgate.logs.filter_global_log")


class LogFileCanary(SynchronousTestCase):
    """nxgate.logs makes twistd's ``--logfile`` a SturdyLogFile: it finds the
    file as the text observer's ``_outFile`` and reuses LogFile's
    ``_openFile``, ``_file``, ``listLogs`` and ``size``."""

    def test_the_text_observer_keeps_its_file_and_the_log_file_its_parts(self):
        directory = self.mktemp()
        os.makedirs(directory)
        made = logfile.LogFile("x.log", directory)
        self.addCleanup(made.close)
        self.assertIs(getattr(textFileLogObserver(made), "_outFile", None), made,
                      "twisted.logger's file observer no longer keeps _outFile: re-check nxgate.logs._sturdy")
        for name in ("_file", "size", "maxRotatedFiles", "path"):
            self.assertTrue(hasattr(made, name), f"LogFile lost {name}: re-check nxgate.logs.SturdyLogFile")
        self.assertEqual(made.listLogs(), [])
        self.assertIn("self._file =", inspect.getsource(logfile.BaseLogFile._openFile))
        self.assertEqual(logfile.LogFile.synchronized, ["write", "rotate"])


class SendNowCanary(SynchronousTestCase):
    """nxgate.wire.tcp.send_now sends on a socket transport's ``socket`` at
    once when Twisted's write buffer (``dataBuffer`` from ``offset``,
    ``_tempDataBuffer``) is empty and the transport is neither closing nor
    half-closed (``disconnecting``, ``_writeDisconnected``); it looks
    through ``ProtocolWrapper``\\ s whose ``write`` only forwards."""

    def test_the_buffer_and_state_names_are_there(self):
        from twisted.internet import abstract, tcp, unix
        from twisted.protocols.policies import ProtocolWrapper

        self.assertTrue(issubclass(tcp.Connection, abstract.FileDescriptor))
        self.assertTrue(issubclass(unix.Server, abstract.FileDescriptor))
        descriptor = abstract.FileDescriptor()
        for name in ("dataBuffer", "offset", "_tempDataBuffer", "_writeDisconnected", "disconnecting", "connected"):
            self.assertTrue(hasattr(descriptor, name), f"Twisted's FileDescriptor lost {name}: re-check send_now")
        source = inspect.getsource(abstract.FileDescriptor.doWrite)
        for name in ("self.dataBuffer", "self.offset", "self._tempDataBuffer"):
            self.assertIn(name, source, f"FileDescriptor.doWrite no longer uses {name}: re-check send_now")
        self.assertIn("self.transport.write(data)", inspect.getsource(ProtocolWrapper.write))


class ConchChannelDataCanary(SynchronousTestCase):
    """nxgate.wire.ssh_etm's lean path for channel data does what Conch's
    ``SSHTransportBase.dataReceived`` loop, ``SSHConnection.ssh_CHANNEL_DATA``
    and ``SSHChannel.write`` do, with their names."""

    def test_conchs_steps_are_the_ones_replicated(self):
        from twisted.conch.ssh import channel, connection, transport

        loop = inspect.getsource(transport.SSHTransportBase.dataReceived)
        self.assertIn("self.dispatchMessage(messageNum, packet[1:])", loop)
        self.assertIn("packet = self.getPacket()", loop)
        received = inspect.getsource(connection.SSHConnection.ssh_CHANNEL_DATA)
        for step in ("dataLength > channel.localWindowLeft or dataLength > channel.localMaxPacket",
                     "channel.localWindowLeft -= dataLength",
                     "if channel.localWindowLeft < channel.localWindowSize // 2:",
                     "channel.dataReceived(data)"):
            self.assertIn(step, received, "Conch's ssh_CHANNEL_DATA changed: re-check EtmTransport._channel_data")
        write = inspect.getsource(channel.SSHChannel.write)
        for step in ("if self.buf:", "self.remoteWindowLeft", "rmp = self.remoteMaxPacket", "self.conn.sendData",
                     "if self.closing and not self.buf:"):
            self.assertIn(step, write, "Conch's SSHChannel.write changed: re-check SplicedChannel.write")
        send = inspect.getsource(connection.SSHConnection.sendData)
        self.assertIn("if channel.localClosed:", send)
        for name in ("_keyExchangeState", "_KEY_EXCHANGE_NONE", "_blockedByKeyExchange"):
            self.assertIn(name, inspect.getsource(transport.SSHTransportBase))
