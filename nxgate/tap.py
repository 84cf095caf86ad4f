"""``twistd nxgate``: command-line options and the service they build."""

from __future__ import annotations

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
        state_dir = self["state-dir"] and os.path.abspath(self["state-dir"])
        self.config = configuration.with_overrides(config, listen=self["port"], state_dir=state_dir)


def makeService(options: Options):  # type: ignore[no-untyped-def]
    from twisted.internet import reactor

    from nxgate.gateway.root import Gateway
    from nxgate.instance import StartupError
    from nxgate.store.errors import StoreError

    try:
        return Gateway(options.config, reactor)
    except (StartupError, StoreError) as error:
        # One line that says what to do, not a traceback: twistd has not
        # started logging or forked yet, so stderr is the admin's terminal
        # (or the service manager's journal).
        raise SystemExit(f"nxgate: {error}") from None
