# nxgate: `make install`, `make run`, `make test` (see README).
# Debian's Python: session programs started as users (viewers, dialogs) run
# this venv's interpreter, which must not live in root's home (pyenv).
PYTHON  ?= $(firstword $(wildcard /usr/bin/python3) python3)
VENV    := $(CURDIR)/.venv
STATE   ?= $(CURDIR)/.state
STAMP   := $(VENV)/.installed
# Where `make run` listens: every interface, port 4022, unless told otherwise
# (`make run PORT=4122`, `make run LISTEN=tcp:4022:interface=127.0.0.1:backlog=1024`).
PORT    ?= 4022
LISTEN  ?= tcp:$(PORT):backlog=1024
# Where `make install` (as root) links the venv's commands, so that
# nxgate-client and nxgate-admin are on PATH.
BINDIR  ?= /usr/local/bin
COMMANDS := nxgate-client nxgate-admin nxgate-config nxgate-session

# Debian packages the gateway and its end-to-end tests need.
APT_PACKAGES := python3 python3-venv python3-dev gcc make libpam0g \
	nxagent nxproxy xvfb xauth x11-utils x11-xserver-utils xterm xdotool \
	imagemagick openssh-client openssh-server libssh-dev socat procps iproute2 passwd \
	xfce4-session xfwm4 xfce4-panel xfdesktop4 dbus-x11 python3-tk x11-apps \
	xrdp x11vnc tigervnc-standalone-server freerdp2-x11 freerdp2-shadow-x11 xtightvncviewer ssl-cert fail2ban \
	dbus libglib2.0-bin bubblewrap

# Building the Debian package, and its test (tests/test_debian_package.py runs with NXGATE_TEST_DEB=1).
DEB_PACKAGES := dpkg-dev debhelper dh-python python3-all python3-setuptools git
APT_PACKAGES += $(DEB_PACKAGES)
# Several machines: the shared session store's servers (tests start private instances).
APT_PACKAGES += postgresql mariadb-server mariadb-client
# The HAProxy TCP front of several gateways (conf/haproxy-nxgate.cfg, tested end to end).
APT_PACKAGES += haproxy
# Sound: a real PulseAudio on the client side of the e2e test, paplay/parec, sox for the tone.
APT_PACKAGES += pulseaudio pulseaudio-utils sox
# Printing: the session's own cupsd and lp/lpstat, and on the client side of the e2e test a real
# CUPS in front of ippeveprinter (an IPP printer that keeps each job as a file).
APT_PACKAGES += cups-daemon cups-client cups-bsd cups-filters cups-ipp-utils
# Folder sharing: smbnetfs (FUSE, fuse3) mounts the client's share in the session; the
# client's private Samba (samba: smbd, pdbedit) serves it; smbclient for the e2e test and the bench.
APT_PACKAGES += smbnetfs fuse3 samba smbclient
# The browser portal's tests drive Debian's headless Chromium through chromedriver (Selenium).
APT_PACKAGES += chromium chromium-driver
# The in-browser viewer serves Debian's noVNC, fed by x11vnc (above) on a private Xvfb.
APT_PACKAGES += novnc
# The viewer's clipboard test copies and pastes in the session with xclip.
APT_PACKAGES += xclip
# The browser viewer gives its Xvfb a keymap with every Latin-1 key (setxkbmap: x11-xkb-utils).
APT_PACKAGES += x11-xkb-utils
# X2Go's own command-line client (python-x2go, Debian's nxproxy) drives the X2Go door's e2e test.
APT_PACKAGES += python3-x2go pyhoca-cli
# X2Go's Qt client, driven by a session profile under the client Xvfb.
APT_PACKAGES += x2goclient
# Programs tests call that Debian 12 usually has already: openssl (the portal's and the cluster's test
# certificates), systemd-analyze (the package's unit is verified), readelf (nxcopy is a hardened PIE).
APT_PACKAGES += openssl systemd binutils
# Remmina's X2Go plugin (it runs pyhoca-cli), tested under the client Xvfb.
APT_PACKAGES += remmina remmina-plugin-x2go
# The X2Go door's attack tests drive paramiko (what python-x2go uses) from Debian's python3.
APT_PACKAGES += python3-paramiko
# X2Go's shared folders (sshfs as the session's user, FUSE 3) and printing (PDFs checked with
# pdftotext; cups-filters and ghostscript convert what is printed to PDF).
APT_PACKAGES += sshfs fuse3 poppler-utils ghostscript

.PHONY: install system-packages link-commands run test bench bench-profile deb clean

install: system-packages $(STAMP)
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) -s link-commands; fi

# Symlinks in $(BINDIR) to the venv's commands; a file there that is not a
# symlink (someone else's nxgate-client) is left alone, with a word.
link-commands:
	@for c in $(COMMANDS); do \
	  if [ -e "$(BINDIR)/$$c" ] && [ ! -L "$(BINDIR)/$$c" ]; then \
	    echo "not linking $(BINDIR)/$$c: a file of that name is already there (use $(VENV)/bin/$$c)"; \
	  elif [ "$$(readlink "$(BINDIR)/$$c")" != "$(VENV)/bin/$$c" ]; then \
	    ln -sfn "$(VENV)/bin/$$c" "$(BINDIR)/$$c" && echo "linked $(BINDIR)/$$c -> $(VENV)/bin/$$c"; \
	  fi; \
	done

# Installs the missing Debian packages when run as root; otherwise says what is missing.
system-packages:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	  else \
	    echo "missing Debian packages:$$missing (run 'make install' as root, or apt-get install them)"; exit 1; \
	  fi; \
	fi
	@if [ "$$(id -u)" = 0 ] && [ -d /etc/pam.d ] && [ ! -e /etc/pam.d/nxgate ]; then \
	  install -m 644 conf/pam.d/nxgate /etc/pam.d/nxgate && echo "installed /etc/pam.d/nxgate"; \
	fi

$(STAMP): setup.py requirements.txt helpers/nxcopy.c $(shell find nxgate twisted -name '*.py')
	$(MAKE) -C helpers all
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements.txt
	$(VENV)/bin/pip install -q --no-deps rdpyqt==2.1.6
	# setuptools' build/ keeps every module it ever copied: a module that moved or was removed would
	# still be installed (and imported by the programs run as other users) from a stale build/.
	rm -rf build
	$(VENV)/bin/pip install -q --no-deps --force-reinstall .
	touch $@

run: install
	$(VENV)/bin/twistd --nodaemon --pidfile= nxgate --config conf/nxgate.conf --state-dir $(STATE) --port $(LISTEN)

# The whole suite, TEST_JOBS modules at a time (tests/harness/suite.py; one module alone:
# PYTHONPATH=. .venv/bin/trial tests.test_x). CI adds TEST_ARGS="--allowed-skips .ci/allowed-skips".
TEST_JOBS ?= 4
TEST_ARGS ?=
test: install
	cd $(CURDIR) && PYTHONPATH=$(CURDIR) $(VENV)/bin/python -m tests.harness.suite --jobs $(TEST_JOBS) \
	  --temp-directory $(CURDIR)/_trial_temp $(TEST_ARGS)

# Benchmarks (root; 15-25 min): figures, peers and ratios in one table, see bench/README.md.
bench: install
	PYTHONPATH=$(CURDIR) $(VENV)/bin/python bench/run.py $(BENCH_ARGS)

bench-profile: install
	$(VENV)/bin/pip install -q py-spy
	PYTHONPATH=$(CURDIR) $(VENV)/bin/python bench/run.py --profile $(BENCH_ARGS)

deb:
	dpkg-buildpackage -us -uc -b

clean:
	rm -rf $(VENV) build dist *.egg-info _trial_temp
	$(MAKE) -C helpers clean
