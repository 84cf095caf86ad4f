"""Packaging for nxgate: the package, the twistd plugin, console scripts and conf files."""

import re
import subprocess

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py


class BuildWithHelper(build_py):
    """Compiles helpers/nxcopy (hardened, -Werror) before packaging it."""

    def run(self):
        subprocess.run(["make", "-C", "helpers", "all"], check=True)
        super().run()


with open("nxgate/__init__.py", encoding="utf-8") as handle:
    VERSION = re.search(r'__version__ = "([^"]+)"', handle.read()).group(1)

setup(
    name="nxgate",
    version=VERSION,
    description="NX 3 remote desktop gateway on Twisted: Conch SSH, nxagent sessions, RDP/VNC proxies",
    license="GPL-2.0-or-later",
    python_requires=">=3.11",
    # twisted/plugins has no __init__.py on purpose: it joins Twisted's plugin package.
    packages=find_packages(include=["nxgate", "nxgate.*"]) + ["twisted.plugins"],
    package_data={"nxgate.clients.nx": ["nomachine-client.key"], "nxgate.gateway.doors.web": ["static/*", "viewer_static/*"]},
    install_requires=[
        "Twisted[conch]>=22.4",
        "pyOpenSSL",
        "service_identity",
        "python-pam>=2.0.2",
        "txdbus",
    ],
    entry_points={
        "console_scripts": [
            "nxgate-config = nxgate.configtool:main",
            "nxgate-client = nxgate.clients.nx.main:main",
            "nxgate-shell = nxgate.gateway.doors.openssh.login_shell:main",
            "nxgate-admin = nxgate.gateway.doors.admin.cli:main",
            "nxgate-session = nxgate.gateway.doors.dbus.cli:main",
            # The session cupsd's backend of X2Go's printer (run by cupsd as the session's user).
            "nxgate-x2go-print = nxgate.node.services.x2go_print:main",
        ],
    },
    cmdclass={"build_py": BuildWithHelper},
    data_files=[
        # nxcopy goes beside the console scripts, where nxgate-shell looks first.
        ("bin", ["helpers/nxcopy"]),
        ("share/nxgate/conf", ["conf/nxgate.conf", "conf/nx_authorized_keys"]),
        ("share/nxgate/conf/pam.d", ["conf/pam.d/nxgate"]),
        ("share/dbus-1/system.d", ["conf/dbus/org.nxgate.Gateway1.conf"]),
        ("share/applications", ["conf/nxgate-disconnect.desktop"]),
    ],
)
