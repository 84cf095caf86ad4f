"""The composition root: builds the gateway's services from a Config."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from twisted.application import service, strports
from twisted.application.internet import TimerService
from twisted.cred.portal import Portal
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import quoteStringArgument
from twisted.logger import Logger, globalLogPublisher
from twisted.python.failure import Failure
from twisted.web.server import Site

from nxgate import config as configuration
from nxgate import metrics
from nxgate.gateway.doors.admin.server import AdminFactory
from nxgate.audit import AuditLog
from nxgate.gateway.auth.pam import Authenticator
from nxgate.config import Config
from nxgate.logs import filter_global_log, flush_repeats
from nxgate.loops import steady
from nxgate.gateway.doors.conversation import Conversation
from nxgate.instance import StartupError, check_port_free, claim_unix_socket, lock_state_dir, record_pid
from nxgate.protocols.nx.dispatch import NXDispatcher
from nxgate.protocols.nx.server_dialogue import DialogueSettings
from nxgate.wire.relay import StreamRelay
from nxgate.node.files import StateLayout
from nxgate.node.service import SessionService
from nxgate.store.factory import open_store
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.results import StreamTarget
from nxgate.gateway.membership import no_links
from nxgate.gateway.router import Router
from nxgate.node.launcher import Launcher
from nxgate.node.local import LocalNode
from nxgate.vocabulary.model import member_name
from nxgate.threads import in_thread
from nxgate.users import UserDirectory, resolve_caller
from nxgate.gateway.auth.throttle import Throttle
from nxgate.gateway.doors.openssh.socket import OpenSSHDoorFactory
from nxgate.node.shadow_sessions import ShadowService
from nxgate.gateway.doors.conch import checkers, hostkeys
from nxgate.gateway.doors.guard import DoorGuard, raise_file_limit
from nxgate.wire.guarded import authenticated, user_logged_in
from nxgate.gateway.doors.preauth import Limits
from nxgate.gateway.doors.conch.channel import ChannelHandler, ChannelTransport
from nxgate.gateway.doors.conch.server import NXAvatar, NXRealm, NXSessionChannel, NXSSHFactory, kex_service

log = Logger()


def shell_settings(config: Config) -> DialogueSettings:
    return DialogueSettings(
        server_name=config.server_name,
        protocol_version=config.server.protocol_version,
        max_line_length=config.shell.max_line_length,
        max_login_attempts=config.auth.max_login_attempts,
        login_timeout=config.auth.login_timeout,
        idle_timeout=config.shell.idle_timeout,
    )


def startup_line(config: Config, serves_doors: bool, pam_service: str) -> tuple[str, dict[str, Any]]:
    """The start-up log line and its fields: what this process listens on.

    A member with role node only opens no door (no SSH port, portal, D-Bus
    or shell socket): saying it listens for NX logins on [server] listen
    (4022 by default) sent admins looking for a port that is not there
    (issue 27)."""
    common = {"state_dir": config.server.state_dir, "source": config.source}
    if not serves_doors and config.cluster is not None:
        return ("nxgate starting as cluster member {name} with role node only: no NX logins here (no SSH port,"
                " web portal, D-Bus or shell socket; [server] listen is not used); gateways reach it on"
                " {where} ([cluster] listen); state in {state_dir}, config {source}",
                {"name": config.cluster.name, "where": configuration.describe_listen(config.cluster.listen),
                 **common})
    return ("nxgate starting: listening on {where} ({listen}) for NX logins with the passwords of Unix accounts"
            " (PAM service {pam}; never as {denied}); state in {state_dir}, config {source}",
            {"where": configuration.describe_listen(config.server.listen), "listen": config.server.listen,
             "pam": pam_service, "denied": ", ".join(config.auth.deny_users) or "-", **common})


def read_config(source: str) -> tuple[Config, list[Any]]:
    """Load and check the config file at ``source`` and the nx account's
    keys it names (blocking: file reads, the host name look-up).  Raises
    ConfigError with every problem, a key file that cannot be read included."""
    new = configuration.load(source if os.path.exists(source) else None)
    try:
        nx_keys = checkers.load_nx_keys(new.ssh.nx_authorized_keys)
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise configuration.ConfigError(
            [f"[ssh] nx_authorized_keys: cannot read {new.ssh.nx_authorized_keys}: {reason}"]) from error
    return new, nx_keys


class Gateway(service.MultiService):
    """Everything one ``twistd nxgate`` runs."""

    def __init__(self, config: Config, reactor: Any) -> None:
        super().__init__()
        self.config = config
        self.reactor = reactor
        self.started = reactor.seconds()
        self.blocking = in_thread(reactor)
        # Before any door opens: the open file limit as high as we may, and
        # the guard every listening door asks (issue 26, nxgate.gateway.doors.guard).
        self.file_limits = raise_file_limit()
        self.guard = DoorGuard(reactor, Limits.from_config(config))
        flush = TimerService(15.0, steady(self.guard.flush, "logging the refusals of unauthenticated connections"))
        flush.clock = reactor
        flush.setServiceParent(self)
        repeats = TimerService(15.0, steady(flush_repeats, "logging the counts of repeated lines held back"))
        repeats.clock = reactor
        repeats.setServiceParent(self)
        self.users = UserDirectory(self.blocking)
        self.layout = StateLayout(config.server.state_dir)
        self.layout.prepare()
        # Before anything else touches the state or its sockets: a second
        # gateway on the same directory stops here (see nxgate.instance).
        self.lock_fd = lock_state_dir(self.layout.root)
        # [cluster] roles: a gateway serves the doors, a node runs sessions;
        # without [cluster] this box is both, exactly as a single box.
        roles = config.cluster.roles if config.cluster else frozenset({"gateway", "node"})
        self.serves_doors = "gateway" in roles
        if self.serves_doors:
            check_port_free(config.server.listen, "[server] listen, or --port")
        if config.metrics.listen:
            check_port_free(config.metrics.listen, "[metrics] listen")
        self.throttle = Throttle(reactor, config.auth.throttle_per_address, config.auth.throttle_per_account,
                                 config.auth.throttle_window, config.auth.throttle_block)
        self.authenticator = Authenticator(
            reactor,
            config.auth.pam_service,
            deny_users=config.auth.deny_users,
            threads=config.auth.pam_threads,
            failed_login_delay=config.auth.failed_login_delay,
            throttle=self.throttle,
        )
        # [store] url: the state directory's SQLite file by default, or a
        # database server shared by a cluster (migrated here, before serving).
        self.store = open_store(config, self.layout, reactor)
        # This machine's node (role node; a single box has it): its session
        # service, and the node interface over it that the router here and
        # every other gateway of a cluster call.  A member that only routes
        # has none: no supervisor, no agents, nothing to reconcile.
        self.sessions: SessionService | None = None
        self.node: LocalNode | None = None
        web = bool(config.web.listen) and self.serves_doors
        if "node" in roles:
            self.sessions = SessionService(reactor, config, self.store, self.layout, blocking=in_thread(reactor),
                                           room=self.guard.users_may_open)
            self.sessions.setServiceParent(self)
            self.shadow = self.sessions.shadow = ShadowService(self.sessions, config, self.blocking, self.users)
        # This machine's browser viewers: the node's live ones (its ``view`` streams) and the portal's
        # own for what a live viewer cannot show (see nxgate.node.browser_viewer).
        self.viewers = self._browser_viewers() if web or "node" in roles else None
        if self.sessions is not None:
            self.node = LocalNode(self.sessions, self.users,
                                  lambda: member_name(self.config) or self.config.server_name, self.blocking,
                                  self.viewers, room=self.guard.users_may_open)
        # A cluster member writes its heartbeat to the shared store (nodes, drain --node); a single box
        # writes none, and lists its one node.
        self.membership = self._membership()
        if config.cluster:
            self._cluster_wire(config.cluster)
        # What every door calls: the router, over the cluster or over this box, a cluster of one.
        self.api = self._router()
        self.commands = NXDispatcher(self.api)
        self.shell_settings = shell_settings(config)
        self.ssh_factory = self._ssh_factory()
        if self.serves_doors:
            strports.service(config.server.listen, self.guard.wrap(self.ssh_factory, "SSH")).setServiceParent(self)
        if config.server.shell_socket and self.serves_doors:
            # Local: only its deadline and the file reserve (the kernel names the peer; no address to cap).
            self._listen_unix(config.server.shell_socket, 0o666,
                              self.guard.wrap(OpenSSHDoorFactory(self), "shell socket", counted=False),
                              "[server] shell_socket")
        self._listen_unix(config.server.admin_socket or os.path.join(self.layout.root, "admin.sock"), 0o600,
                          AdminFactory(self), "[server] admin_socket")
        self.dbus = self._dbus_door() if config.dbus.enabled and self.serves_doors else None
        self.web = self._web_door() if web else None
        if config.metrics.listen:
            if not metrics.available():
                raise RuntimeError("[metrics] listen is set but prometheus-client is not installed")
            node = member_name(config) or config.server_name
            strports.service(config.metrics.listen,
                             Site(metrics.resource(self.sessions, node, self.guard))).setServiceParent(self)

    def _membership(self) -> Any:
        from nxgate.gateway.membership import Membership

        membership = Membership(self.config, self.store, self.reactor,
                                lambda: self.sessions.live_count() if self.sessions is not None else 0,
                                draining=lambda: self.sessions is not None and self.sessions.draining)
        if self.config.cluster:
            membership.setServiceParent(self)
        return membership

    def _cluster_wire(self, cluster: Any) -> None:
        """The members' wire: this member's TLS credentials, and the node
        listener when it has role node.  Routing, and the streams to other
        members' sessions, are the router's and its remote nodes'."""
        from OpenSSL import SSL

        from nxgate.wire.node_listener import NodeListener, gateway_members
        from nxgate.wire.tls import ClusterTLS

        try:
            self.cluster_tls = ClusterTLS.from_config(cluster)
        except (OSError, SSL.Error) as error:
            raise RuntimeError(f"[cluster] ca, certificate or key cannot be used: {error}") from error
        if "node" in cluster.roles:
            check_port_free(cluster.listen, "[cluster] listen")
            NodeListener(cluster.listen, self.cluster_tls, self.node, gateway_members(self.store),
                         wrap=lambda factory: self.guard.wrap(factory, "cluster", trusts=True)).setServiceParent(self)
            log.info("cluster member {name}: listening for gateways on {where}", name=cluster.name,
                     where=configuration.describe_listen(cluster.listen))

    def _router(self) -> Router:
        """The session API of every door (nxgate.gateway.router): new
        sessions placed, the others sent to the node that runs them; on a
        single box, all to this machine's node."""
        if not self.config.cluster:
            return Router(self.reactor, lambda: self.config, self.node, self.store, room=self.guard.users_may_open)
        from nxgate.wire.remote_node import RemoteNodes

        self.remote_nodes = RemoteNodes(self.config, self.reactor, self.cluster_tls)
        # A member that serves doors keeps a link to every node (keep_in_touch), whose state is the node's.
        api = Router(self.reactor, lambda: self.config, self.node, self.store, self.remote_nodes.get,
                     self.remote_nodes.link_state if self.serves_doors else no_links, room=self.guard.users_may_open)
        self.remote_nodes.listener = api.heard  # every member's session events, through its connection
        if self.serves_doors:
            touch = TimerService(self.config.cluster.heartbeat, steady(api.keep_in_touch, "keeping in touch with the members"))
            touch.clock = self.reactor
            touch.setServiceParent(self)
        return api

    def _dbus_door(self) -> Any:
        """The D-Bus door (org.nxgate.Gateway1), or None without txdbus: the
        gateway serves NX the same either way."""
        try:
            from nxgate.gateway.doors.dbus.door import DBusDoor
        except ImportError as error:
            log.warn("D-Bus session control is off: {error} (install python3-txdbus or txdbus)", error=str(error))
            return None
        door = DBusDoor(self.reactor, self.api, self._dbus_caller, self.config.dbus.address,
                        account=self.authenticator.account)
        self.api.observers.append(door.session_changed)  # every member's sessions, through the router
        door.setServiceParent(self)
        return door

    def _browser_viewers(self) -> Any:
        """This machine's browser viewers (x11vnc per open tab: on a session's own display for the node's
        ``view`` streams, or in a private display for ``/view``'s resumed ones)."""
        from nxgate.node.browser_viewer import BrowserViewers, ViewerLimits, ViewerPrograms

        viewers = BrowserViewers(self.reactor, self._launcher, os.path.join(self.layout.root, "viewers"),
                                 self.layout.logs, ViewerLimits(per_user=self.config.web.max_viewers),
                                 ViewerPrograms(path=self.config.sessions.path, lang=self.config.sessions.lang),
                                 self.blocking)
        viewers.prepare()
        return viewers

    @property
    def _launcher(self) -> Launcher:
        """The one launcher of programs run as users: the session service's, or this member's own."""
        if self.sessions is not None:
            return self.sessions.launcher
        if getattr(self, "own_launcher", None) is None:
            self.own_launcher = Launcher(self.reactor)
        return self.own_launcher

    def _web_door(self) -> Any:
        """The browser portal (``[web] listen``); a listen it refuses (plain
        HTTP off loopback) stops the start with the reason."""
        from nxgate.gateway.doors.web.door import WebDoor
        from nxgate.gateway.doors.web.tls import WebConfigError, check_listen

        try:
            check_listen(self.config.web.listen)
        except WebConfigError as error:
            raise StartupError(str(error)) from None
        check_port_free(self.config.web.listen, "[web] listen")
        door = WebDoor(reactor=self.reactor, service=self.api, authenticator=self.authenticator,
                       resolve=self._web_caller, settings=lambda: self.config.web,
                       thumbnailer=lambda caller, view: self.api.thumbnail(caller, view.id),
                       types=self._browser_types, certificate_dir=os.path.join(self.layout.root, "web"),
                       host_name=self.config.server_name, viewers=self.viewers,
                       wrap=lambda factory, tls: self.guard.wrap(factory, "HTTPS" if tls else "HTTP", http=True,
                                                                 inside_tls=tls))
        door.setServiceParent(self)
        return door

    async def _web_caller(self, user: str, address: str) -> Caller:
        return await self.blocking(resolve_caller, user, address, "127.0.0.1", "web")

    def _browser_types(self) -> list[str]:
        """The session types a browser may start: installed ones that need nothing but a name."""
        from nxgate.node.programs import available_types
        return [name for name in available_types(self.config.types, self.config.sessions) if name != "unix-application"]

    async def _dbus_caller(self, uid: int) -> Caller:
        """Who a D-Bus sender with ``uid`` (the bus daemon's word) is: root
        and members of ``[dbus] admin_groups`` act on every session."""
        entry = await self.users.by_uid(uid)
        caller = await self.blocking(resolve_caller, entry.pw_name, f"D-Bus (uid {uid})", "127.0.0.1", "dbus")
        admin = uid == 0 or bool(caller.groups & set(self.config.dbus.admin_groups))
        return dataclasses.replace(caller, admin=admin)

    def _listen_unix(self, path: str, mode: int, factory: Any, setting: str) -> None:
        """A Unix socket; a stale one from a previous run is removed, a live
        one (another gateway's) never."""
        os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
        claim_unix_socket(path, setting)
        endpoint = f"unix:{quoteStringArgument(path)}:mode={mode:o}:lockfile=0"
        strports.service(endpoint, factory).setServiceParent(self)

    def reload(self) -> Deferred[dict[str, Any]]:
        """Re-read the config file; apply what can change while running.

        Reading and checking the file (and the nx account's keys, and the
        host name it resolves) is disk and DNS work, so it runs through
        ``blocking``; the answer is then applied on the reactor, in one turn.
        A bad file changes nothing.  Where the gateway listens and keeps its
        state, and the PAM thread count, need a restart (the answer says so).
        """
        def refused(failure: Failure) -> dict[str, Any]:
            failure.trap(configuration.ConfigError)
            return {"ok": False, "problems": failure.value.problems}

        d = self.blocking(read_config, self.config.source)
        d.addCallbacks(lambda loaded: self.apply(*loaded), refused)
        return d

    def apply(self, new: Config, nx_keys: list[Any]) -> dict[str, Any]:
        """Apply a configuration :func:`read_config` loaded and checked (on the reactor)."""
        old = self.config
        restart = configuration.restart_needed(old, new)
        # Where it listens and keeps its state stays as it runs (with what
        # came from the command line) until a restart.
        new = new.replace(server=dataclasses.replace(new.server, listen=old.server.listen,
                                                     state_dir=old.server.state_dir), overrides=old.overrides)
        self.config = new
        self.authenticator.deny_users = tuple(new.auth.deny_users)
        self.authenticator.failed_login_delay = new.auth.failed_login_delay
        self.guard.configure(Limits.from_config(new))
        self.throttle.configure(new.auth.throttle_per_address, new.auth.throttle_per_account,
                                new.auth.throttle_window, new.auth.throttle_block)
        self.shell_settings = shell_settings(new)
        if self.sessions is not None:
            self.sessions.config, self.sessions.settings = new, new.sessions
            self.shadow.config, self.shadow.settings = new, new.shadow
        self.ssh_factory.login_grace_time = new.ssh.login_grace_time
        self.ssh_factory.max_auth_tries = new.ssh.max_auth_tries
        for checker in self.checkers:
            checker.nx_user = new.ssh.nx_user
        self.key_checker.nx_keys = nx_keys
        self.users.forget()
        filter_global_log(new.server.log_level, new.server.log_rotated_files)
        log.info("configuration reloaded from {source}", source=new.source)
        return {"ok": True, "source": new.source, "restart_needed_for": restart}

    def _ssh_factory(self) -> NXSSHFactory:
        ssh = self.config.ssh
        self.x2go = self._x2go_door() if self.config.x2go.enabled and ssh.user_logins else None
        portal = Portal(NXRealm(self._open_nx_channel, ssh.max_channels, self.x2go))
        nx_keys = checkers.load_nx_keys(ssh.nx_authorized_keys)
        user_auth = self.authenticator if ssh.user_logins else None
        self.key_checker = checkers.PublicKeyChecker(self.reactor, ssh.nx_user, nx_keys, user_auth)
        self.checkers: list[Any] = [self.key_checker]
        if ssh.user_logins:
            self.checkers += [checkers.PasswordChecker(ssh.nx_user, self.authenticator),
                              checkers.KeyboardInteractiveChecker(self.reactor, ssh.nx_user, self.authenticator)]
        for checker in self.checkers:
            portal.registerChecker(checker)
        host_keys = hostkeys.load_host_keys(self.layout.hostkeys)
        return NXSSHFactory(portal, host_keys, ssh.login_grace_time, ssh.max_auth_tries, kex_service(self.reactor, ssh))

    def _x2go_door(self) -> Any:
        """X2Go's clients on the SSH port (nxgate.gateway.doors.conch.x2go), for users' own logins."""
        from nxgate.gateway.doors.conch.x2go.door import X2GoDoor

        return X2GoDoor(self.reactor, lambda: self.api, self.blocking, self.users, lambda: self.config,
                        room=self.guard.users_may_open)

    def conversation(self, transport: Any, address: str, preauthenticated_user: str | None,
                     relay_factory: Any, local_address: str = "127.0.0.1", door: str = "nx",
                     logged_in: Any = None, claim: Any = None) -> Conversation:
        """A new NX conversation (not started) over ``transport``."""
        return Conversation(
            self.reactor, self.shell_settings, transport, address, self.authenticator, self.commands,
            relay_factory=relay_factory, preauthenticated_user=preauthenticated_user, local_address=local_address,
            door=door, blocking=self.blocking, logged_in=logged_in, claim=claim,
        )

    def _open_nx_channel(self, avatar: NXAvatar, channel: NXSessionChannel) -> ChannelHandler:
        # The nx account's key is public (every NX client ships it): its SSH login
        # proves nothing, so the connection counts as unauthenticated until the NX login.
        ssh = channel.conn.transport
        conversation = self.conversation(ChannelTransport(channel), channel.peer, avatar.principal.unix_user,
                                         self._relay, channel.local_address, door="nx-conch",
                                         logged_in=lambda: authenticated(ssh.transport),
                                         claim=lambda user: user_logged_in(ssh.transport, user))
        handler = ChannelHandler(conversation, channel)
        conversation.start()
        return handler

    def _relay(self, client: Caller, target: StreamTarget, transport: ChannelTransport, leftover: bytes) -> StreamRelay:
        """After ``bye``: the channel relayed to the agent's stream, which the router opens on the session's node."""
        return StreamRelay(client, target.session_id, transport, leftover, self.api.open_stream)

    def privilegedStartService(self) -> None:
        # The doors bind their ports here, before startService: their lines go through the filter too.
        filter_global_log(self.config.server.log_level, self.config.server.log_rotated_files)
        super().privilegedStartService()

    def startService(self) -> None:
        record_pid(self.lock_fd)  # twistd may have forked since the lock was taken
        filter_global_log(self.config.server.log_level, self.config.server.log_rotated_files)
        self.audit = AuditLog(self.config.server.audit_log or os.path.join(self.layout.root, "audit.log"))
        globalLogPublisher.addObserver(self.audit)
        self.authenticator.start()
        before, soft, hard = self.file_limits
        log.info("open file limit {soft} (hard {hard}{raised}); the doors keep {reserve} of them free for"
                 " sessions, PAM and the store ([server] fd_reserve)", soft=soft, hard=hard,
                 raised=f", raised from {before}" if soft != before else "", reserve=self.config.server.fd_reserve)
        text, fields = startup_line(self.config, self.serves_doors, self.authenticator.service)
        log.info(text, **fields)
        if getattr(self, "x2go", None) is not None and self.serves_doors:
            log.info("X2Go clients (x2goclient, pyhoca-cli) may log in to the same SSH port as themselves and use"
                     " their sessions ([x2go] enabled)")
        super().startService()

    def stopService(self) -> Any:
        if self.viewers is not None:
            self.viewers.close_all()
        d = super().stopService()
        globalLogPublisher.removeObserver(self.audit)
        self.audit.close()
        self.authenticator.stop()
        # After the session service has flushed its last writes (a database
        # server's are still on their way when its stopService returns).
        d.addBoth(lambda result: self.store.close().addBoth(lambda _: result))
        return d
