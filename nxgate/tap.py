"""``twistd nxgate``: command-line options and the service they build."""

from __future__ import annotations

import dataclasses
import os

from twisted.python import usage

from nxgate import config as configuration

DEFAULT_CONFIG = "/etc/nxgate/nxgate.conf"


class Options(usage.Options):
    synopsis = "[--config FILE] [--port ENDPOINT] [--state-dir DIR]"
    longdesc = (
        "Run the nxgate NX server. Without --config, /etc/nxgate/nxgate.conf is read if it "
        "exists, else built-in defaults apply. --port and --state-dir override the config."
    )
    optParameters = [
        ["config", "c", None, "configuration file (INI)"],
        ["port", "p", None, "Twisted endpoint to listen on, e.g. tcp:4022"],
        ["state-dir", "d", None, "directory for host keys, the session store and session files"],
    ]

    def postOptions(self) -> None:
        filename = self["config"]
        if filename is None and os.path.exists(DEFAULT_CONFIG):
            filename = DEFAULT_CONFIG
        try:
            config = configuration.load(filename)
        except configuration.ConfigError as error:
            raise usage.UsageError(str(error)) from None
        server = config.server
        if self["port"]:
            server = dataclasses.replace(server, listen=self["port"])
        if self["state-dir"]:
            server = dataclasses.replace(server, state_dir=os.path.abspath(self["state-dir"]))
        self.config = config.replace(server=server)


def makeService(options: Options):  # type: ignore[no-untyped-def]
    from twisted.internet import reactor

    from nxgate.gateway import Gateway
    from nxgate.instance import StartupError

    try:
        return Gateway(options.config, reactor)
    except StartupError as error:
        # twistd has not started logging or forked yet: stderr is the
        # admin's terminal (or the service manager's journal).
        raise SystemExit(f"nxgate: {error}") from None
