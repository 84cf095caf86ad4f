"""The browser door as a service of the gateway: the HTTPS endpoint, the
site and the timer that ends idle logins."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from twisted.application.internet import StreamServerEndpointService, TimerService
from twisted.application.service import MultiService
from twisted.logger import Logger

from nxgate.gateway.auth.pam import Authenticator
from nxgate.gateway.doors.web import tls
from nxgate.loops import steady
from nxgate.gateway.doors.web.site import ResolveCaller, Thumbnailer, web_site
from nxgate.vocabulary.api import SessionAPI

log = Logger()

EXPIRY_PERIOD = 15.0


class WebDoor(MultiService):
    """``[web] listen``: the portal (and the viewer under ``/view``)."""

    def __init__(self, *, reactor: Any, service: SessionAPI, authenticator: Authenticator, resolve: ResolveCaller,
                 thumbnailer: Thumbnailer, settings: Callable[[], Any], types: Callable[[], Sequence[str]],
                 certificate_dir: str, host_name: str, viewers: Any = None,
                 wrap: Callable[[Any, bool], Any] | None = None) -> None:
        """``wrap(site, tls)``: what listens in front of the site (the
        gateway's guard of unauthenticated connections, nxgate.gateway.doors.guard)."""
        super().__init__()
        web = settings()
        self.listen = web.listen
        self.endpoint = tls.server_endpoint(web.listen, web.certificate, web.private_key, certificate_dir, host_name)
        self.site, self.auth = web_site(reactor=reactor, service=service, authenticator=authenticator,
                                        resolve=resolve, thumbnailer=thumbnailer, settings=settings, types=types,
                                        viewers=viewers, tls=tls.is_tls(web.listen))
        front = wrap(self.site, tls.is_tls(web.listen)) if wrap is not None else self.site
        listening = StreamServerEndpointService(tls.listening_endpoint(reactor, self.endpoint), front)
        listening._raiseSynchronously = True  # a port in use stops the start, as strports.service did
        listening.setServiceParent(self)
        timer = TimerService(EXPIRY_PERIOD, steady(self.site.expire_logins, "expiring idle portal logins"))  # type: ignore[attr-defined]
        timer.clock = reactor
        timer.setServiceParent(self)

    def startService(self) -> None:
        log.info("web portal on {listen} ({kind})", listen=self.listen,
                 kind="HTTPS" if tls.is_tls(self.listen) else "plain HTTP on loopback")
        super().startService()

