/*
 * nxcopy - full-duplex byte relay for the nxgate "OpenSSH deployment mode".
 *
 * The nx account's login shell negotiates the NX session in Python and then
 * exec()s this helper so that the bulk NX proxy stream flows
 *
 *     sshd  <->  nxcopy (client side: in-fd/out-fd)  <->  nxagent socket (server side)
 *
 * without any Python in the data path.  The client side is whatever sshd hands
 * us on stdin/stdout (two pipes or one socketpair); the server side is a
 * single full-duplex socket: a TCP connection we make (--connect), a Unix
 * socket (--unix) or an inherited descriptor (--fd).
 *
 * usage: nxcopy [--in-fd N] [--out-fd M] (--connect HOST:PORT | --unix PATH | --fd K)
 *               [--buffer BYTES] [--no-splice] [--connect-timeout SECONDS]
 *
 * Exit codes:
 *   0  both directions reached EOF and every byte was delivered
 *   1  I/O error or peer reset (ECONNRESET, EPIPE, ...)
 *   2  usage error (bad option or value, descriptor not open)
 *   3  cannot connect to the server side (refused, name lookup failed,
 *      unreachable, or --connect-timeout expired; default 10 s)
 *
 * Design, in short:
 *  - Each direction is pumped independently; all descriptors are
 *    non-blocking and a single poll(2) waits for exactly the one event each
 *    direction is blocked on, so an idle session costs nothing and a 1-byte
 *    write is forwarded as soon as it is readable (no buffering for
 *    "efficiency", TCP_NODELAY on TCP).
 *  - Data is moved with splice(2): straight from/to a side that is itself a
 *    pipe, otherwise through a private pipe (socket -> pipe -> socket).  If
 *    the kernel refuses splice for a descriptor (EINVAL/ENOSYS, e.g. a tty
 *    or an O_APPEND file) that direction falls back to read/write, carrying
 *    over anything already staged in the pipe.
 *  - "Drain before fill": a direction only reads when everything it read
 *    before has been written.  That bounds memory, gives back-pressure for
 *    free, makes EAGAIN unambiguous and guarantees buffered data is flushed
 *    before EOF is propagated (shutdown(SHUT_WR) on a socket, close otherwise).
 *
 * It needs no privileges and never runs a shell.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

enum { EXIT_IO = 1, EXIT_USAGE = 2, EXIT_CONNECT = 3 };

/* How a direction moves bytes. */
enum mode {
	M_STAGED, /* src -> private pipe -> dst, both with splice */
	M_DIRECT, /* src or dst is a pipe: one splice does it */
	M_RW      /* plain read()/write() through a heap buffer */
};

struct dir {
	const char *name;    /* for messages */
	int src, dst;
	int dst_is_sock;     /* EOF is sent with shutdown(), not close() */
	int may_close_dst;   /* 0 if dst is shared with the other direction */
	enum mode mode;
	int pipefd[2];       /* M_STAGED only */
	size_t held;         /* bytes read but not yet written (pipe or buf) */
	char *buf;           /* M_RW only */
	size_t off;          /* start of unwritten data in buf */
	int eof;             /* src reported EOF */
	int done;            /* EOF propagated, direction finished */
	short wait_events;   /* what to poll for next: POLLIN on src or POLLOUT on dst */
};

/* Per-direction pipe/buffer size.  Bigger is a little faster on bulk data,
 * but pipe capacity is charged to the user (fs.pipe-user-pages-soft, 64 MiB
 * by default) and every session runs as the same nx account: once that is
 * exhausted *all* new pipes of the user, sshd's included, shrink to 8 KiB.
 * 128 KiB x 2 directions keeps that well out of reach for ~150 sessions. */
static size_t bufsize = 128 * 1024;
static int out_closed;

/* More rounds than this in one go would let a busy direction starve the
 * other one; poll() is level-triggered, so we simply come back. */
#define ROUNDS 16

static void usage(FILE *f)
{
	fprintf(f,
		"usage: nxcopy [--in-fd N] [--out-fd M] (--connect HOST:PORT | --unix PATH | --fd K)\n"
		"              [--buffer BYTES] [--no-splice] [--connect-timeout SECONDS]\n"
		"Relays in-fd (default 0) -> server side and server side -> out-fd (default 1)\n"
		"until both directions have ended.  HOST may be a name, an IPv4 address or an\n"
		"IPv6 address in brackets ([::1]:4000).  --buffer is the per-direction pipe or\n"
		"buffer size (default %zu); --connect-timeout defaults to 10 seconds.\n"
		"exit codes: 0 both directions ended normally, 1 I/O error or peer reset,\n"
		"            2 usage error, 3 cannot connect (refused, lookup failure, timeout)\n",
		bufsize);
}

static int is_fifo(int fd)
{
	struct stat st;
	return fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode);
}

static int is_sock(int fd)
{
	struct stat st;
	return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

/* Strict decimal parse: the whole string, no sign games, within [lo, hi]. */
static int parse_long(const char *s, long lo, long hi, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

static long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

/* Wait for a non-blocking connect() to finish; returns 0 or an errno value. */
static int wait_connected(int fd, long deadline)
{
	struct pollfd p = { .fd = fd, .events = POLLOUT };
	for (;;) {
		long left = deadline - now_ms();
		if (left <= 0)
			return ETIMEDOUT;
		int r = poll(&p, 1, (int)(left > INT_MAX ? INT_MAX : left));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return errno;
		if (r == 0)
			return ETIMEDOUT;
		int err = 0;
		socklen_t len = sizeof err;
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
			return errno;
		return err;
	}
}

/* Try every address the name resolves to, all within one overall deadline,
 * so "localhost" still works when ::1 is listed first but nothing listens there. */
static int connect_tcp(const char *host, const char *port, long timeout_ms)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res, *ai;
	int fd = -1, err = 0;
	int gai = getaddrinfo(host, port, &hints, &res);
	if (gai) {
		fprintf(stderr, "nxcopy: cannot resolve %s:%s: %s\n", host, port, gai_strerror(gai));
		return -1;
	}
	long deadline = now_ms() + timeout_ms;
	for (ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
		if (fd < 0) {
			err = errno;
			continue;
		}
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
			err = 0;
		else
			err = errno == EINPROGRESS ? wait_connected(fd, deadline) : errno;
		if (err == 0)
			break;
		close(fd);
		fd = -1;
		if (err == ETIMEDOUT)
			break; /* the budget is spent; don't start another attempt */
	}
	freeaddrinfo(res);
	if (fd < 0) {
		fprintf(stderr, "nxcopy: cannot connect to %s:%s: %s\n", host, port, strerror(err));
		return -1;
	}
	/* NX traffic is interactive: never let Nagle hold back a keystroke. */
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	return fd;
}

/* A Unix connect() only blocks while the listener's backlog is full; bound
 * that wait with SO_SNDTIMEO (which is what the kernel uses for it). */
static int connect_unix(const char *path, long timeout_ms)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct timeval tv = { .tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000 };
	struct timeval zero = { 0, 0 };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		perror("nxcopy: socket");
		return -1;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1); /* length checked in main() */
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		int err = errno == EAGAIN ? ETIMEDOUT : errno;
		fprintf(stderr, "nxcopy: cannot connect to %s: %s\n", path, strerror(err));
		close(fd);
		return -1;
	}
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &zero, sizeof zero);
	return fd;
}

/* Switch a direction to read/write.  Bytes already staged in the private pipe
 * are pulled into the buffer first, so nothing is lost or reordered. */
static int fall_back(struct dir *d)
{
	if (!d->buf && !(d->buf = malloc(bufsize))) {
		fprintf(stderr, "nxcopy: %s: out of memory\n", d->name);
		return -1;
	}
	size_t got = 0;
	if (d->mode == M_STAGED) {
		while (got < d->held) {
			ssize_t n = read(d->pipefd[0], d->buf + got, d->held - got);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				fprintf(stderr, "nxcopy: %s: draining pipe: %s\n", d->name,
					n ? strerror(errno) : "unexpected EOF");
				return -1;
			}
			got += (size_t)n;
		}
		close(d->pipefd[0]);
		close(d->pipefd[1]);
		d->pipefd[0] = d->pipefd[1] = -1;
	}
	d->held = got;
	d->off = 0;
	d->mode = M_RW;
	return 0;
}

static int splice_unsupported(int e)
{
	return e == EINVAL || e == ENOSYS || e == EOPNOTSUPP;
}

/* Is fd readable (data, EOF or error) right now? */
static int readable_now(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	return poll(&p, 1, 0) > 0;
}

/* Propagate EOF to dst.  Only called once everything read has been written. */
static void finish(struct dir *d)
{
	d->done = 1;
	if (d->dst_is_sock) {
		/* Half-close: the peer sees EOF but can keep sending to us. */
		if (shutdown(d->dst, SHUT_WR) < 0 && errno != ENOTCONN)
			fprintf(stderr, "nxcopy: %s: shutdown: %s\n", d->name, strerror(errno));
	} else if (d->may_close_dst) {
		close(d->dst);
		out_closed = 1;
	}
}

/* Move as much as possible without blocking.  Returns -1 on a fatal error. */
static int pump(struct dir *d)
{
	const unsigned fl = SPLICE_F_MOVE | SPLICE_F_NONBLOCK;
	for (int round = 0; round < ROUNDS && !d->done; round++) {
		ssize_t n;
		if (d->held > 0) { /* 1. drain what we already hold */
			if (d->mode == M_STAGED)
				n = splice(d->pipefd[0], NULL, d->dst, NULL, d->held, fl);
			else
				n = write(d->dst, d->buf + d->off, d->held);
			if (n < 0) {
				if (errno == EINTR)
					continue;
				if (errno == EAGAIN || errno == EWOULDBLOCK) {
					d->wait_events = POLLOUT;
					return 0;
				}
				if (d->mode == M_STAGED && splice_unsupported(errno)) {
					if (fall_back(d) < 0)
						return -1;
					continue;
				}
				fprintf(stderr, "nxcopy: %s: write: %s\n", d->name, strerror(errno));
				return -1;
			}
			d->held -= (size_t)n;
			d->off += (size_t)n;
			continue;
		}
		d->off = 0;
		if (d->eof) { /* 2. nothing held: now EOF may be passed on */
			finish(d);
			return 0;
		}
		/* 3. read more; in M_DIRECT this also writes it */
		if (d->mode == M_STAGED)
			n = splice(d->src, NULL, d->pipefd[1], NULL, bufsize, fl);
		else if (d->mode == M_DIRECT)
			n = splice(d->src, NULL, d->dst, NULL, bufsize, fl);
		else
			n = read(d->src, d->buf, bufsize);
		if (n > 0) {
			if (d->mode != M_DIRECT)
				d->held = (size_t)n;
			continue;
		}
		if (n == 0) {
			d->eof = 1;
			continue;
		}
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			/* Our staging pipe is empty here, so EAGAIN means "src is empty".
			 * A direct splice cannot tell whether src was empty or dst full;
			 * src readiness is exact for pipes and sockets, so ask it. */
			d->wait_events = (d->mode == M_DIRECT && readable_now(d->src)) ? POLLOUT : POLLIN;
			return 0;
		}
		if (d->mode != M_RW && splice_unsupported(errno)) {
			if (fall_back(d) < 0)
				return -1;
			continue;
		}
		fprintf(stderr, "nxcopy: %s: read: %s\n", d->name, strerror(errno));
		return -1;
	}
	d->wait_events = d->held > 0 ? POLLOUT : POLLIN;
	return 0;
}

/* Choose how a direction moves data; returns -1 only if out of memory. */
static int setup_dir(struct dir *d, const char *name, int src, int dst, int no_splice)
{
	d->name = name;
	d->src = src;
	d->dst = dst;
	d->dst_is_sock = is_sock(dst);
	d->may_close_dst = 1;
	d->pipefd[0] = d->pipefd[1] = -1;
	d->wait_events = POLLIN;
	if (!no_splice && (is_fifo(src) || is_fifo(dst))) {
		d->mode = M_DIRECT;
		return 0;
	}
	if (!no_splice && pipe2(d->pipefd, O_NONBLOCK | O_CLOEXEC) == 0) {
		d->mode = M_STAGED;
		/* Best effort: a bigger pipe means fewer syscalls.  It fails with
		 * EPERM above pipe-max-size or once the user's pipe-user-pages
		 * budget is used up; the default 64 KiB pipe still works then. */
		(void)fcntl(d->pipefd[1], F_SETPIPE_SZ, (int)bufsize);
		return 0;
	}
	d->mode = M_DIRECT; /* i.e. "nothing staged": fall_back() just allocates */
	return fall_back(d);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "in-fd", required_argument, NULL, 'i' },
		{ "out-fd", required_argument, NULL, 'o' },
		{ "connect", required_argument, NULL, 'c' },
		{ "unix", required_argument, NULL, 'u' },
		{ "fd", required_argument, NULL, 'f' },
		{ "buffer", required_argument, NULL, 'b' },
		{ "no-splice", no_argument, NULL, 'n' },
		{ "connect-timeout", required_argument, NULL, 't' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 }
	};
	long in_fd = 0, out_fd = 1, srv_fd = -1, v;
	const char *connect_to = NULL, *unix_path = NULL;
	int no_splice = 0, nserver = 0, c, rc = 0;
	double timeout_s = 10.0;
	char *end;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'i': if (parse_long(optarg, 0, INT_MAX, &in_fd)) goto bad; break;
		case 'o': if (parse_long(optarg, 0, INT_MAX, &out_fd)) goto bad; break;
		case 'f': if (parse_long(optarg, 0, INT_MAX, &srv_fd)) goto bad; nserver++; break;
		case 'c': connect_to = optarg; nserver++; break;
		case 'u': unix_path = optarg; nserver++; break;
		case 'n': no_splice = 1; break;
		case 'b':
			if (parse_long(optarg, 1024, 64L << 20, &v)) goto bad;
			bufsize = (size_t)v;
			break;
		case 't':
			errno = 0;
			timeout_s = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(timeout_s > 0 && timeout_s <= 86400)) goto bad;
			break;
		case 'h': usage(stdout); return 0;
		default: goto bad;
		}
	}
	if (optind != argc || nserver != 1)
		goto bad;
	if (unix_path && (!*unix_path || strlen(unix_path) >= sizeof(((struct sockaddr_un *)0)->sun_path)))
		goto bad;
	/* All descriptors must be open, and the server side must not double as a client side. */
	if (fcntl((int)in_fd, F_GETFL) < 0 || fcntl((int)out_fd, F_GETFL) < 0 ||
	    (srv_fd >= 0 && (fcntl((int)srv_fd, F_GETFL) < 0 || srv_fd == in_fd || srv_fd == out_fd)))
		goto bad;

	/* A vanished reader must surface as EPIPE (exit 1), not kill us silently. */
	signal(SIGPIPE, SIG_IGN);

	int sock = (int)srv_fd;
	long timeout_ms = (long)(timeout_s * 1000.0 + 0.5);
	if (connect_to) {
		/* "[v6addr]:port", otherwise split at the last colon. */
		char *spec = strdup(connect_to), *host = spec, *port = NULL;
		if (!spec) {
			perror("nxcopy");
			return EXIT_IO;
		}
		if (*spec == '[') {
			char *rb = strchr(spec, ']');
			if (rb && rb[1] == ':') {
				*rb = '\0';
				host = spec + 1;
				port = rb + 2;
			}
		} else if ((port = strrchr(spec, ':')) != NULL)
			*port++ = '\0';
		if (!port || !*host || !*port) {
			free(spec);
			goto bad;
		}
		sock = connect_tcp(host, port, timeout_ms);
		free(spec);
	} else if (unix_path)
		sock = connect_unix(unix_path, timeout_ms);
	if (sock < 0)
		return EXIT_CONNECT;
	if (srv_fd >= 0) { /* inherited: make sure it is ours alone and interactive */
		int one = 1;
		(void)fcntl(sock, F_SETFD, FD_CLOEXEC);
		(void)setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	}

	/* Remember the client side's flags: the file descriptions may be shared
	 * (e.g. a terminal), and leaving them non-blocking would upset others. */
	int in_fl = fcntl((int)in_fd, F_GETFL), out_fl = fcntl((int)out_fd, F_GETFL);
	fcntl((int)in_fd, F_SETFL, in_fl | O_NONBLOCK);
	fcntl((int)out_fd, F_SETFL, out_fl | O_NONBLOCK);
	fcntl(sock, F_SETFL, fcntl(sock, F_GETFL) | O_NONBLOCK);

	struct dir up = { .pipefd = { -1, -1 } }, down = up, *dirs[2] = { &up, &down };
	if (setup_dir(&up, "client->server", (int)in_fd, sock, no_splice) < 0 ||
	    setup_dir(&down, "server->client", sock, (int)out_fd, no_splice) < 0)
		up.done = down.done = 1, rc = EXIT_IO; /* skip the loop, clean up */
	/* Never close() a descriptor the other direction still reads from; such
	 * a non-socket side just stays open until exit (a socket is half-closed). */
	up.may_close_dst = 0;
	if (out_fd == in_fd)
		down.may_close_dst = 0;

	while (!up.done || !down.done) {
		struct pollfd pfd[2];
		struct dir *owner[2];
		int n = 0;
		for (int i = 0; i < 2; i++) {
			struct dir *d = dirs[i];
			if (d->done)
				continue;
			pfd[n].fd = d->wait_events == POLLIN ? d->src : d->dst;
			pfd[n].events = d->wait_events;
			pfd[n].revents = 0;
			owner[n++] = d;
		}
		if (poll(pfd, (nfds_t)n, -1) < 0) {
			if (errno == EINTR)
				continue;
			perror("nxcopy: poll");
			rc = EXIT_IO;
			break;
		}
		/* POLLHUP/POLLERR are "ready" too: the next syscall reports EOF or the error. */
		for (int i = 0; i < n && rc == 0; i++)
			if (pfd[i].revents && pump(owner[i]) < 0)
				rc = EXIT_IO;
		if (rc)
			break;
	}

	for (int i = 0; i < 2; i++) {
		if (dirs[i]->pipefd[0] >= 0) {
			close(dirs[i]->pipefd[0]);
			close(dirs[i]->pipefd[1]);
		}
		free(dirs[i]->buf);
	}
	close(sock);
	fcntl((int)in_fd, F_SETFL, in_fl);
	close((int)in_fd);
	if (!out_closed && out_fd != in_fd) {
		fcntl((int)out_fd, F_SETFL, out_fl);
		close((int)out_fd);
	}
	return rc;

bad:
	usage(stderr);
	return EXIT_USAGE;
}
