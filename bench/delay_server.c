// A server with a known delay, for measuring load generators' accuracy (bench/compare.py
// accuracy). It answers every HTTP/1.1 request after exactly DELAY_US microseconds,
// measured from the moment it read the request's last byte, and on SIGTERM prints what it
// applied: requests answered and percentiles of the delay from reading to writing, so a
// generator's reported latency can be set against what the server really did.
//
//   cc -O2 -o delay_server bench/delay_server.c && ./delay_server 2000
//   -> prints "port N", serves on 127.0.0.1:N until SIGTERM, then one line of JSON.
//
// One thread, epoll, a timerfd. The delay is the same for every request, so answers fall
// due in the order requests arrive: one FIFO queue is the whole schedule.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_FD 65536
#define QUEUE (1 << 20)
#define HIST_US 100000

static const char RESPONSE[] =
    "HTTP/1.1 200 OK\r\nContent-Length: 6\r\nx-backend: delay\r\n\r\nhello\n";

struct pending { int fd; uint32_t gen; uint64_t read_ns; };
static struct pending queue[QUEUE];
static size_t head, tail;
static uint32_t gen[MAX_FD];
static char tailbuf[MAX_FD][4];   // last bytes seen, to find "\r\n\r\n" across reads
static uint64_t hist[HIST_US + 1], answered, late_past_hist;
static volatile sig_atomic_t stop;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void on_term(int sig) { (void)sig; stop = 1; }

static void arm(int tfd, uint64_t at_ns) {
    struct itimerspec spec = {0};
    spec.it_value.tv_sec = at_ns / 1000000000u;
    spec.it_value.tv_nsec = at_ns % 1000000000u;
    timerfd_settime(tfd, TFD_TIMER_ABSTIME, &spec, NULL);
}

// Counts complete request heads in buf (requests carry no body here).
static int heads(int fd, const char *buf, ssize_t n) {
    int found = 0;
    char *t = tailbuf[fd];
    for (ssize_t i = 0; i < n; i++) {
        t[0] = t[1]; t[1] = t[2]; t[2] = t[3]; t[3] = buf[i];
        if (memcmp(t, "\r\n\r\n", 4) == 0) { found++; memset(t, 0, 4); }
    }
    return found;
}

static uint64_t percentile(double p) {
    uint64_t want = (uint64_t)(p / 100.0 * (double)answered + 0.5), seen = 0;
    if (want == 0) want = 1;
    for (uint64_t us = 0; us <= HIST_US; us++) {
        seen += hist[us];
        if (seen >= want) return us;
    }
    return HIST_US;
}

int main(int argc, char **argv) {
    uint64_t delay_ns = (uint64_t)(argc > 1 ? atol(argv[1]) : 2000) * 1000u;
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    signal(SIGPIPE, SIG_IGN);
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) || listen(lfd, 4096)) { perror("listen"); return 1; }
    socklen_t len = sizeof addr;
    getsockname(lfd, (struct sockaddr *)&addr, &len);
    printf("port %d\n", ntohs(addr.sin_port));
    fflush(stdout);
    int ep = epoll_create1(0), tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    ev.data.fd = tfd;
    epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &ev);
    struct epoll_event events[256];
    char buf[16384];
    while (!stop) {
        int n = epoll_wait(ep, events, 256, 200);
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == lfd) {
                int c;
                while ((c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    if (c >= MAX_FD) { close(c); continue; }
                    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    memset(tailbuf[c], 0, 4);
                    struct epoll_event cev = {.events = EPOLLIN, .data.fd = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
                }
            } else if (fd == tfd) {
                uint64_t expirations;
                if (read(tfd, &expirations, sizeof expirations) < 0 && errno != EAGAIN) break;
            } else {
                ssize_t r = read(fd, buf, sizeof buf);
                if (r <= 0) {
                    if (r < 0 && errno == EAGAIN) continue;
                    gen[fd]++;
                    close(fd);
                    continue;
                }
                uint64_t t = now_ns();
                for (int k = heads(fd, buf, r); k > 0; k--) {
                    if (tail - head == QUEUE) break;   // never with sane loads
                    if (tail == head) arm(tfd, t + delay_ns);
                    queue[tail++ % QUEUE] = (struct pending){fd, gen[fd], t};
                }
            }
        }
        uint64_t t = now_ns();
        while (head != tail && queue[head % QUEUE].read_ns + delay_ns <= t) {
            struct pending p = queue[head++ % QUEUE];
            if (p.gen != gen[p.fd]) continue;   // that connection closed meanwhile
            uint64_t written = now_ns();
            if (write(p.fd, RESPONSE, sizeof RESPONSE - 1) < 0) continue;
            uint64_t us = (written - p.read_ns) / 1000u;
            if (us > HIST_US) { late_past_hist++; us = HIST_US; }
            hist[us]++;
            answered++;
        }
        if (head != tail) arm(tfd, queue[head % QUEUE].read_ns + delay_ns);
    }
    printf("{\"answered\": %llu, \"delay_us\": %llu, \"applied_us\": {\"p50\": %llu, \"p90\": %llu, "
           "\"p99\": %llu, \"max\": %llu}}\n",
           (unsigned long long)answered, (unsigned long long)(delay_ns / 1000u),
           (unsigned long long)percentile(50), (unsigned long long)percentile(90),
           (unsigned long long)percentile(99), (unsigned long long)percentile(100));
    return 0;
}
