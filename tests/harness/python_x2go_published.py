"""python-x2go's published-applications API, as pyhoca-gui uses it (run with Debian's python3, not the venv).

    python3 python_x2go_published.py HOST PORT USER ROOTDIR 'EXEC…'   (the password on standard input)

Registers a published-applications session (type P, ``cmd=PUBLISHED``), connects, starts it, prints the menu as one JSON line (the
``desktop`` text and the ``icon`` base64 of each entry), then starts the
entry whose ``Exec`` line is EXEC with ``exec_published_application`` --
python-x2go's own call -- and stays attached (the session's window on the
client) until it is killed.

The menu comes from python-x2go's own ``x2gogetapps`` call
(``get_published_applications(very_raw=True)``), cut into entries as its
``raw=True`` would: Debian 12's python3-x2go (0.6.1.3) fails there itself,
whatever the server (it splits the bytes it read with a str), and so
does the menu it asks for in the background when a profile says
``published_applications=True``: the profile leaves that off.
"""

import json
import sys
import time

import x2go


def main() -> None:
    host, port, user, rootdir, wanted = sys.argv[1:6]
    password = sys.stdin.readline().rstrip("\n")
    client = x2go.X2GoClient(start_xserver=False, use_cache=False, loglevel=x2go.loglevel_WARN,
                             sessions_rootdir=rootdir, ssh_rootdir=rootdir)
    uuid = client.register_session(host, port=int(port), username=user, add_to_known_hosts=True,
                                   known_hosts=f"{rootdir}/known_hosts", profile_name="published",
                                   session_type="published", published_applications=False, cmd="PUBLISHED",
                                   geometry="800x600", link="lan", snd_system="none", printing=False,
                                   allow_share_local_folders=False)
    client.connect_session(uuid, password=password)
    client.start_session(uuid)
    session = client.get_session(uuid)
    output = session.get_published_applications(very_raw=True, refresh=True).decode()
    menu = []
    for item in (part.replace("<desktop>\n", "") for part in output.split("</desktop>\n")):
        if "<icon>\n" in item and "</icon>" in item:
            menu.append({"desktop": item.split("<icon>\n")[0] + item.split("</icon>\n")[1],
                         "icon": item.split("<icon>\n")[1].split("</icon>\n")[0]})
        elif item:
            menu.append({"desktop": item, "icon": None})
    print(json.dumps(menu), flush=True)
    for item in menu:
        for line in item["desktop"].splitlines():
            if not line.startswith("Exec="):
                continue
            # The command line python-x2go's menu makes of an Exec line (control/plain.py).
            command = line.split("=")[1].strip()
            command = command.replace("%f", "").replace("%F", "").replace("%u", "").replace("%U", "")
            if command.strip() == wanted:
                session.exec_published_application(command)
                print("STARTED", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
