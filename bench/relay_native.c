/* A minimal native relay for bench/relay_loop.py: epoll, one broker connection per client connection,
   bytes relayed as they come (no framing: the floor of any relay).

       relay_native LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT [splice]

   "splice": each connection's bytes go socket -> pipe -> socket with splice(2), never through user space,
   instead of read(2) into a buffer and write(2) out of it. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAXFD 65536
#define PIPE_BYTES (1 << 20)
static int peer[MAXFD];
static int pipe_in[MAXFD], pipe_out[MAXFD]; /* per socket: the pipe its bytes go through (splice mode) */
static char buf[256 * 1024];

static void wait_for(int fd, short events) {
    struct pollfd q = {fd, events, 0};
    poll(&q, 1, -1);
}

static int write_all(int fd, const char *p, ssize_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EAGAIN) { wait_for(fd, POLLOUT); continue; }
            if (errno == EINTR) continue;
            return -1;
        }
        p += w; n -= w;
    }
    return 0;
}

/* Move what is readable on fd to its peer through fd's pipe; -1 when the connection ends. */
static int splice_some(int fd) {
    ssize_t in = splice(fd, NULL, pipe_in[fd], NULL, PIPE_BYTES, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (in == 0) return -1;
    if (in < 0) return errno == EAGAIN ? 0 : -1;
    while (in > 0) {
        ssize_t out = splice(pipe_out[fd], NULL, peer[fd], NULL, in, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (out < 0) {
            if (errno == EAGAIN) { wait_for(peer[fd], POLLOUT); continue; }
            return -1;
        }
        in -= out;
    }
    return 0;
}

static void make_pipe(int fd) {
    int p[2];
    if (pipe2(p, O_NONBLOCK)) { perror("pipe2"); exit(1); }
    fcntl(p[0], F_SETPIPE_SZ, PIPE_BYTES);
    pipe_out[fd] = p[0]; pipe_in[fd] = p[1];
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) { fprintf(stderr, "usage: relay LISTEN_PORT HOST PORT [splice]\n"); return 2; }
    int use_splice = argc == 5 && strcmp(argv[4], "splice") == 0;
    int one = 1;
    struct sockaddr_in up = {0};
    up.sin_family = AF_INET; up.sin_port = htons(atoi(argv[3])); inet_pton(AF_INET, argv[2], &up.sin_addr);
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in me = {0};
    me.sin_family = AF_INET; me.sin_port = htons(atoi(argv[1])); me.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(ls, (struct sockaddr *)&me, sizeof me) || listen(ls, 128)) { perror("listen"); return 1; }
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls};
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    struct epoll_event events[64];
    for (;;) {
        int n = epoll_wait(ep, events, 64, -1);
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == ls) {
                int c = accept(ls, NULL, NULL);
                if (c < 0) continue;
                int b = socket(AF_INET, SOCK_STREAM, 0);
                if (c >= MAXFD || b >= MAXFD || connect(b, (struct sockaddr *)&up, sizeof up)) {
                    close(c); close(b); continue;
                }
                setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                setsockopt(b, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                fcntl(c, F_SETFL, O_NONBLOCK);
                fcntl(b, F_SETFL, O_NONBLOCK);
                peer[c] = b; peer[b] = c;
                if (use_splice) { make_pipe(c); make_pipe(b); }
                struct epoll_event e1 = {.events = EPOLLIN, .data.fd = c}, e2 = {.events = EPOLLIN, .data.fd = b};
                epoll_ctl(ep, EPOLL_CTL_ADD, c, &e1);
                epoll_ctl(ep, EPOLL_CTL_ADD, b, &e2);
                continue;
            }
            int failed;
            if (use_splice) {
                failed = splice_some(fd);
            } else {
                ssize_t r = read(fd, buf, sizeof buf);
                failed = r == 0 || (r < 0 && errno != EAGAIN) || (r > 0 && write_all(peer[fd], buf, r));
            }
            if (failed) {
                int p = peer[fd];
                if (use_splice) { close(pipe_in[fd]); close(pipe_out[fd]); close(pipe_in[p]); close(pipe_out[p]); }
                close(fd); close(p);
            }
        }
    }
}
