"""The composition root: builds the gateway's services from a Config."""

from __future__ import annotations

import os
from typing import Any

from twisted.application import service, strports
from twisted.cred.portal import Portal
from twisted.internet.endpoints import quoteStringArgument
from twisted.logger import Logger

from nxgate.auth import Authenticator
from nxgate.commands import SessionCommands
from nxgate.config import Config
from nxgate.logs import filter_global_log
from nxgate.conversation import Client, Conversation
from nxgate.nx.shell import ShellSettings
from nxgate.relay import AgentRelay
from nxgate.session.files import StateLayout
from nxgate.session.manager import RelayTarget, SessionManager
from nxgate.session.store import SessionStore
from nxgate.shellsocket import ShellFactory
from nxgate.shadow.service import ShadowService
from nxgate.ssh import checkers, hostkeys
from nxgate.ssh.server import NXAvatar, NXRealm, NXSessionChannel, NXSSHFactory

log = Logger(namespace="nxgate")


class ChannelTransport:
    """Lets a conversation write to, and close, an SSH session channel."""

    def __init__(self, channel: NXSessionChannel) -> None:
        self.channel = channel

    def write(self, data: bytes) -> None:
        self.channel.write(data)

    def close(self) -> None:
        self.channel.finish(0)


class ChannelShell:
    """The handler of an NX shell channel: feeds the conversation."""

    def __init__(self, conversation: Conversation, channel: NXSessionChannel) -> None:
        self.conversation = conversation
        self.channel = channel

    def data_received(self, data: bytes) -> None:
        self.conversation.data_received(data)

    def eof_received(self) -> None:
        self.conversation.eof_received()

    def pause_output(self) -> None:
        """The client's SSH window is full: stop reading from the agent."""
        if self.conversation.relay is not None:
            self.conversation.relay.pause_agent()

    def resume_output(self) -> None:
        if self.conversation.relay is not None:
            self.conversation.relay.resume_agent()

    def connection_lost(self) -> None:
        self.conversation.connection_lost()


class Gateway(service.MultiService):
    """Everything one ``twistd nxgate`` runs."""

    def __init__(self, config: Config, reactor: Any) -> None:
        super().__init__()
        self.config = config
        self.reactor = reactor
        self.layout = StateLayout(config.server.state_dir)
        self.layout.prepare()
        self.authenticator = Authenticator(
            reactor,
            config.auth.pam_service,
            deny_users=config.auth.deny_users,
            threads=config.auth.pam_threads,
            failed_login_delay=config.auth.failed_login_delay,
        )
        self.store = SessionStore(self.layout.database)
        self.sessions = SessionManager(reactor, config, self.store, self.layout)
        self.sessions.setServiceParent(self)
        self.commands = SessionCommands(self.sessions, ShadowService(self.sessions, config))
        self.shell_settings = ShellSettings(
            server_name=config.server_name,
            protocol_version=config.server.protocol_version,
            max_line_length=config.shell.max_line_length,
            max_login_attempts=config.auth.max_login_attempts,
            login_timeout=config.auth.login_timeout,
            idle_timeout=config.shell.idle_timeout,
        )
        self.ssh_factory = self._ssh_factory()
        strports.service(config.server.listen, self.ssh_factory).setServiceParent(self)
        if config.server.shell_socket:
            self._prepare_socket_dir(config.server.shell_socket)
            endpoint = f"unix:{quoteStringArgument(config.server.shell_socket)}:mode=666:lockfile=0"
            strports.service(endpoint, ShellFactory(self)).setServiceParent(self)

    def _ssh_factory(self) -> NXSSHFactory:
        ssh = self.config.ssh
        portal = Portal(NXRealm(self._open_shell, ssh.max_channels))
        nx_keys = checkers.load_nx_keys(ssh.nx_authorized_keys)
        user_auth = self.authenticator if ssh.user_logins else None
        portal.registerChecker(checkers.PublicKeyChecker(self.reactor, ssh.nx_user, nx_keys, user_auth))
        if ssh.user_logins:
            portal.registerChecker(checkers.PasswordChecker(ssh.nx_user, self.authenticator))
            portal.registerChecker(checkers.KeyboardInteractiveChecker(self.reactor, ssh.nx_user, self.authenticator))
        host_keys = hostkeys.load_host_keys(self.layout.hostkeys)
        return NXSSHFactory(portal, host_keys, ssh.login_grace_time, ssh.max_auth_tries)

    def conversation(self, transport: Any, address: str, preauthenticated_user: str | None,
                     relay_factory: Any, local_address: str = "127.0.0.1") -> Conversation:
        """A new NX conversation (not started) over ``transport``."""
        return Conversation(
            self.reactor, self.shell_settings, transport, address, self.authenticator, self.commands,
            relay_factory=relay_factory, preauthenticated_user=preauthenticated_user, local_address=local_address,
        )

    def _open_shell(self, avatar: NXAvatar, channel: NXSessionChannel) -> ChannelShell:
        conversation = self.conversation(ChannelTransport(channel), channel.peer, avatar.principal.unix_user,
                                         self._relay, channel.local_address)
        handler = ChannelShell(conversation, channel)
        conversation.start()
        return handler

    @staticmethod
    def _prepare_socket_dir(path: str) -> None:
        """Anyone may connect (the peer's uid decides what it gets); a stale
        socket from a previous run is removed."""
        os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)

    def _relay(self, client: Client, target: RelayTarget, transport: ChannelTransport, leftover: bytes) -> AgentRelay:
        return AgentRelay(self.reactor, client, target, transport, leftover)

    def startService(self) -> None:
        filter_global_log(self.config.server.log_level)
        self.authenticator.start()
        log.info(
            "nxgate starting: listening on {listen}, state in {state_dir}, config {source}",
            listen=self.config.server.listen, state_dir=self.config.server.state_dir, source=self.config.source,
        )
        super().startService()

    def stopService(self) -> Any:
        d = super().stopService()
        self.authenticator.stop()
        self.store.close()
        return d
