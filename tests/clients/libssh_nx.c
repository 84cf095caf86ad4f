/*
 * libssh_nx: an NX client's SSH side built on libssh, the way Remmina's NX
 * plugin uses it, for the end-to-end tests (tests/test_e2e_libssh.py).
 *
 *   libssh_nx HOST PORT USER PRIVATE_KEY LISTEN_PORT
 *
 * It logs in with the private key and no client configuration of its own
 * (no PUBLICKEY_ACCEPTED_TYPES, no ssh_config: libssh's defaults decide the
 * signature algorithm), opens a session channel and asks for a shell
 * without a pty (ssh_channel_request_shell), as Remmina does.  Until the
 * server says "NX> 999 Bye" the channel is carried to stdin/stdout, so the
 * test speaks the NX dialogue; then, like Remmina's tunnel, it accepts one
 * TCP connection on 127.0.0.1:LISTEN_PORT (nxproxy) and relays it to the
 * channel until either side ends.
 *
 * Exit status: 0 after a clean relay, 2 for a usage error, 3 if the SSH
 * connection or login failed (libssh's reason on stderr), 4 for a channel
 * or relay error.
 */
#include <libssh/libssh.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define BYE "NX> 999 Bye"
#define CHUNK 65536

static int write_all(int fd, const char *data, size_t len)
{
    while (len > 0) {
        ssize_t done = write(fd, data, len);
        if (done < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        data += done;
        len -= (size_t)done;
    }
    return 0;
}

/* Where the line "NX> 999 Bye..." ends in this chunk (the index just past
 * its newline), or -1.  ``line``/``line_len`` carry a partial line over
 * from the previous chunk. */
static long find_bye(const char *data, size_t len, char *line, size_t *line_len, size_t line_size)
{
    for (size_t i = 0; i < len; i++) {
        if (data[i] == '\n') {
            int is_bye = *line_len >= strlen(BYE) && memcmp(line, BYE, strlen(BYE)) == 0;
            *line_len = 0;
            if (is_bye)
                return (long)i + 1;
        } else if (*line_len < line_size) {
            line[(*line_len)++] = data[i];
        }
    }
    return -1;
}

static int listen_on(int port)
{
    struct sockaddr_in address = {0};
    int one = 1;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    address.sin_family = AF_INET;
    address.sin_port = htons((unsigned short)port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&address, sizeof address) < 0 || listen(fd, 1) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Carries ``in_fd`` to the channel and the channel to ``out_fd``.  In the
 * dialogue phase (``stop_at_bye``) it returns once the server's Bye line has
 * been passed on, keeping what followed it in ``rest``.  Returns 0 at the end
 * of either side (or at Bye), -1 on an error. */
static int relay(ssh_session session, ssh_channel channel, int in_fd, int out_fd, int stop_at_bye,
                 char *rest, size_t *rest_len)
{
    static char buffer[CHUNK];
    char line[64];
    size_t line_len = 0;
    int in_open = 1;

    for (;;) {
        struct pollfd fds[2] = {
            {.fd = ssh_get_fd(session), .events = POLLIN},
            {.fd = in_open ? in_fd : -1, .events = POLLIN},
        };
        if (poll(fds, 2, 50) < 0 && errno != EINTR)
            return -1;
        if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t got = read(in_fd, buffer, sizeof buffer);
            if (got < 0 && errno != EINTR && errno != EAGAIN)
                return -1;
            if (got == 0) {
                if (!stop_at_bye)
                    return 0;
                in_open = 0;
                ssh_channel_send_eof(channel);
            } else if (got > 0 && ssh_channel_write(channel, buffer, (uint32_t)got) != got) {
                fprintf(stderr, "libssh_nx: channel write failed: %s\n", ssh_get_error(session));
                return -1;
            }
        }
        for (;;) {
            int got = ssh_channel_read_nonblocking(channel, buffer, sizeof buffer, 0);
            if (got == SSH_ERROR) {
                fprintf(stderr, "libssh_nx: channel read failed: %s\n", ssh_get_error(session));
                return -1;
            }
            if (got <= 0)
                break;
            long end = stop_at_bye ? find_bye(buffer, (size_t)got, line, &line_len, sizeof line) : -1;
            if (write_all(out_fd, buffer, end < 0 ? (size_t)got : (size_t)end) < 0)
                return stop_at_bye ? -1 : 0;
            if (end >= 0) {
                *rest_len = (size_t)got - (size_t)end;
                memcpy(rest, buffer + end, *rest_len);
                return 0;
            }
        }
        if (ssh_channel_is_eof(channel) || ssh_channel_is_closed(channel))
            return stop_at_bye ? -1 : 0;
    }
}

int main(int argc, char **argv)
{
    static char rest[CHUNK];
    size_t rest_len = 0;

    if (argc != 6) {
        fprintf(stderr, "usage: %s HOST PORT USER PRIVATE_KEY LISTEN_PORT\n", argv[0]);
        return 2;
    }
    int port = atoi(argv[2]);
    int listener = listen_on(atoi(argv[5]));
    if (listener < 0) {
        perror("libssh_nx: listen");
        return 2;
    }

    ssh_session session = ssh_new();
    ssh_key key = NULL;
    if (session == NULL)
        return 3;
    ssh_options_set(session, SSH_OPTIONS_HOST, argv[1]);
    ssh_options_set(session, SSH_OPTIONS_PORT, &port);
    ssh_options_set(session, SSH_OPTIONS_USER, argv[3]);
    if (ssh_connect(session) != SSH_OK) {
        fprintf(stderr, "libssh_nx: connect failed: %s\n", ssh_get_error(session));
        return 3;
    }
    /* No host key check: the test's gateway has a fresh key every run. */
    if (ssh_pki_import_privkey_file(argv[4], NULL, NULL, NULL, &key) != SSH_OK) {
        fprintf(stderr, "libssh_nx: cannot read the key %s\n", argv[4]);
        return 3;
    }
    if (ssh_userauth_publickey(session, NULL, key) != SSH_AUTH_SUCCESS) {
        fprintf(stderr, "libssh_nx: public key login failed: %s\n", ssh_get_error(session));
        return 3;
    }
    ssh_key_free(key);
    fprintf(stderr, "libssh_nx: logged in\n");

    ssh_channel channel = ssh_channel_new(session);
    if (channel == NULL || ssh_channel_open_session(channel) != SSH_OK
        || ssh_channel_request_shell(channel) != SSH_OK) {
        fprintf(stderr, "libssh_nx: no shell: %s\n", ssh_get_error(session));
        return 4;
    }
    if (relay(session, channel, STDIN_FILENO, STDOUT_FILENO, 1, rest, &rest_len) < 0)
        return 4;

    int stream = accept(listener, NULL, NULL);
    close(listener);
    if (stream < 0) {
        perror("libssh_nx: accept");
        return 4;
    }
    if (write_all(stream, rest, rest_len) < 0)
        return 4;
    int status = relay(session, channel, stream, stream, 0, NULL, NULL) < 0 ? 4 : 0;
    close(stream);
    ssh_channel_close(channel);
    ssh_channel_free(channel);
    ssh_disconnect(session);
    ssh_free(session);
    return status;
}
