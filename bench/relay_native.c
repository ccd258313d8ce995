/* A minimal native relay for bench/relay_loop.py: epoll, one broker connection per client connection,
   bytes read and written on as they come (no framing: the floor of any relay). */
#include <arpa/inet.h>
#include <errno.h>
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
static int peer[MAXFD];
static char buf[256 * 1024];

static int write_all(int fd, const char *p, ssize_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EAGAIN) { struct pollfd q = {fd, POLLOUT, 0}; poll(&q, 1, -1); continue; }
            if (errno == EINTR) continue;
            return -1;
        }
        p += w; n -= w;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: relay LISTEN_PORT HOST PORT\n"); return 2; }
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
                if (connect(b, (struct sockaddr *)&up, sizeof up)) { close(c); close(b); continue; }
                setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                setsockopt(b, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                peer[c] = b; peer[b] = c;
                struct epoll_event e1 = {.events = EPOLLIN, .data.fd = c}, e2 = {.events = EPOLLIN, .data.fd = b};
                epoll_ctl(ep, EPOLL_CTL_ADD, c, &e1);
                epoll_ctl(ep, EPOLL_CTL_ADD, b, &e2);
                continue;
            }
            ssize_t r = read(fd, buf, sizeof buf);
            if (r <= 0 || write_all(peer[fd], buf, r)) {
                int p = peer[fd];
                close(fd); close(p);
            }
        }
    }
}
