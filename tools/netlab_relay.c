/* netlab's delay relay: one-way delay and rate on emulated host links, in user space.
 *
 * tools/netlab.py compiles this with the system cc into a lab's folder and starts it (inside the
 * lab's switch namespace) when a lab is asked for a delay on its host links: this kernel has no
 * netem. Usage:
 *
 *     netlab_relay HOLD_NS BURST_BYTES QUEUE_NS WAKE_NS FIFO_PRIORITY PORT...
 *     PORT = NETNS_PATH,IFNAME,OCTET,RATE
 *
 * For each PORT it enters the namespace NETNS_PATH (setns), makes the TUN device IFNAME there
 * (IFF_TUN | IFF_NO_PI: IPv4 packets, no ARP; IFF_VNET_HDR with checksum and TSO offloads, so
 * TCP's 64 KiB GSO packets and their unchecked checksums cross whole, as on a veth) and comes
 * back; it prints "ready" once all exist (netlab then gives them addresses, MTU and tbf). Then it forwards every IPv4 packet read from a
 * port to the port whose OCTET is the last byte of the packet's destination (others are dropped),
 * releasing it at
 *
 *     ready = read time + HOLD_NS                                 (the delay, less the relay's
 *                                                                 own cost: netlab compensates)
 *     send  = max(ready, tat + (len - BURST_BYTES) / RATE)        (a token bucket per output
 *     tat   = max(tat, send) + len / RATE                          port, tbf's, as GCRA; len
 *                                                                 counts a GSO packet's
 *                                                                 headers once per segment)
 *
 * in FIFO order per output port, so senders into one host are held to its RATE (bits/s; 0:
 * unshaped) as a switch port is. A packet that would wait more than QUEUE_NS for its port is
 * dropped (tbf's limit). A timer here wakes ~20-30 us late (a VM's idle vCPU), so the relay sleeps
 * until WAKE_NS before a packet's time and polls its ports without sleeping from there on: a few
 * microseconds of spinning per wake-up instead of the timer's lateness (not with more than
 * SPIN_MAX_PENDING packets queued: bulk traffic, where a spinning relay would take a core). With
 * FIFO_PRIORITY > 0 it runs SCHED_FIFO: its wake-ups preempt MPI ranks busy-polling every core
 * (which otherwise delayed a release by up to 5 ms here). The relay exits when its stdin closes
 * (the lab gone) or on SIGTERM, and prints its counters on stderr.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define MAX_PORTS 256
#define RING 8192                      /* packets queued per output port, a power of two */
#define VNET 10                        /* struct virtio_net_hdr before each packet */
#define BUF (VNET + 65536 + 4096)      /* a header and the largest (GSO) IPv4 packet */
#define BATCH 64                       /* packets read from one port per wake-up */

typedef struct { unsigned char *data; int len; int64_t send; } Packet;

typedef struct {
    int fd;
    double ns_per_byte;                /* 8e9 / RATE; 0: unshaped */
    int64_t tat;                       /* the token bucket's theoretical arrival time */
    Packet ring[RING];
    unsigned head, tail;
    uint64_t in, out, dropped, bytes_out;
    int64_t late_sum, late_max;        /* ns written after the packet's time */
} Port;

static Port *ports[MAX_PORTS];
static int n_ports;
static Port *by_octet[256];
static unsigned char **pool;           /* free packet buffers */
static int pool_n, pool_cap;
static int64_t hold_ns, burst_bytes, queue_ns, wake_ns;
static volatile sig_atomic_t stop;
static long pending;                   /* packets queued, all ports */
#define SPIN_MAX_PENDING 8             /* more queued (bulk traffic): sleep, do not spin */

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static unsigned char *buffer_get(void)
{
    if (pool_n)
        return pool[--pool_n];
    unsigned char *b = malloc(BUF);
    if (!b) { perror("netlab_relay: malloc"); exit(1); }
    return b;
}

static void buffer_put(unsigned char *b)
{
    if (pool_n == pool_cap) {
        pool_cap = pool_cap ? 2 * pool_cap : 256;
        pool = realloc(pool, pool_cap * sizeof *pool);
        if (!pool) { perror("netlab_relay: realloc"); exit(1); }
    }
    pool[pool_n++] = b;
}

static int tun_open(const char *netns, const char *name, int home)
{
    int ns = open(netns, O_RDONLY | O_CLOEXEC);
    if (ns < 0 || setns(ns, CLONE_NEWNET) < 0) { perror(netns); exit(1); }
    close(ns);
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) { perror("/dev/net/tun"); exit(1); }
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI | IFF_VNET_HDR;
    strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
    if (ioctl(fd, TUNSETIFF, &ifr) < 0) { perror("TUNSETIFF"); exit(1); }
    /* TCP's 64 KiB GSO packets and unchecked checksums pass through whole, as on a veth. */
    if (ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6) < 0) {
        perror("TUNSETOFFLOAD"); exit(1);
    }
    if (setns(home, CLONE_NEWNET) < 0) { perror("setns back"); exit(1); }
    return fd;
}

static void add_port(char *spec, int home)
{
    char *netns = strtok(spec, ","), *name = strtok(NULL, ","), *octet = strtok(NULL, ",");
    char *rate = strtok(NULL, ",");
    if (!netns || !name || !octet || !rate || n_ports == MAX_PORTS) {
        fprintf(stderr, "netlab_relay: bad port %s (want NETNS,IFNAME,OCTET,RATE)\n", spec);
        exit(2);
    }
    Port *p = calloc(1, sizeof *p);
    if (!p) { perror("netlab_relay: calloc"); exit(1); }
    p->fd = tun_open(netns, name, home);
    double bits = atof(rate);
    p->ns_per_byte = bits > 0 ? 8e9 / bits : 0;
    by_octet[atoi(octet) & 255] = p;
    ports[n_ports++] = p;
}

/* Bytes a packet takes on the wire: a GSO packet's segments each carry its headers (hdr_len),
 * as tbf counts them (qdisc_pkt_len). */
static int64_t wire_bytes(const unsigned char *data, int len)
{
    int hdr_len = data[2] | data[3] << 8, gso_size = data[4] | data[5] << 8;
    int64_t bytes = len - VNET;
    if (data[1] != 0 && gso_size > 0 && bytes > hdr_len)       /* gso_type: not NONE */
        bytes += (int64_t)((bytes - hdr_len + gso_size - 1) / gso_size - 1) * hdr_len;
    return bytes;
}

/* Queue one packet read at `now` for its output port (or drop it). */
static void enqueue(unsigned char *data, int len, int64_t now)
{
    Port *q = (len >= VNET + 20 && data[VNET] >> 4 == 4) ? by_octet[data[VNET + 19]] : NULL;
    if (!q || q->tail - q->head == RING) {
        if (q) q->dropped++;
        buffer_put(data);
        return;
    }
    int64_t ready = now + hold_ns, send = ready;
    if (q->ns_per_byte > 0) {
        int64_t bytes = wire_bytes(data, len);
        int64_t early = q->tat + (int64_t)((bytes - burst_bytes) * q->ns_per_byte);
        if (early > send) send = early;
        if (send - ready > queue_ns) { q->dropped++; buffer_put(data); return; }
        q->tat = (q->tat > send ? q->tat : send) + (int64_t)(bytes * q->ns_per_byte);
    }
    q->in++;
    pending++;
    q->ring[q->tail++ & (RING - 1)] = (Packet){data, len, send};
}

/* Write every packet whose time has come; returns the next send time (INT64_MAX: none). */
static int64_t release(int64_t now)
{
    int64_t next = INT64_MAX;
    for (int i = 0; i < n_ports; i++) {
        Port *q = ports[i];
        while (q->head != q->tail) {
            Packet *pk = &q->ring[q->head & (RING - 1)];
            if (pk->send > now) { if (pk->send < next) next = pk->send; break; }
            if (write(q->fd, pk->data, pk->len) == pk->len) { q->out++; q->bytes_out += pk->len; }
            else q->dropped++;
            int64_t late = now - pk->send;
            q->late_sum += late;
            if (late > q->late_max) q->late_max = late;
            buffer_put(pk->data);
            q->head++;
            pending--;
        }
    }
    return next;
}

static void read_port(Port *p)
{
    for (int k = 0; k < BATCH; k++) {
        unsigned char *b = buffer_get();
        ssize_t n = read(p->fd, b, BUF);
        if (n <= 0) { buffer_put(b); return; }
        enqueue(b, (int)n, now_ns());
    }
}

static void on_signal(int sig) { (void)sig; stop = 1; }

int main(int argc, char **argv)
{
    if (argc < 7) {
        fprintf(stderr, "usage: netlab_relay HOLD_NS BURST_BYTES QUEUE_NS WAKE_NS FIFO_PRIORITY"
                " NETNS,IFNAME,OCTET,RATE...\n");
        return 2;
    }
    hold_ns = atoll(argv[1]);
    burst_bytes = atoll(argv[2]);
    queue_ns = atoll(argv[3]);
    wake_ns = atoll(argv[4]);
    prctl(PR_SET_TIMERSLACK, 1UL);     /* wake at the packet's time, not 50 us later */
    struct sched_param sp = {.sched_priority = atoi(argv[5])};
    if (sp.sched_priority > 0 && sched_setscheduler(0, SCHED_FIFO, &sp) < 0)
        perror("netlab_relay: SCHED_FIFO (going on without)");
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);
    int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (home < 0) { perror("/proc/self/ns/net"); return 1; }
    for (int i = 6; i < argc; i++)
        add_port(argv[i], home);
    printf("ready\n");
    fflush(stdout);
    struct pollfd fds[MAX_PORTS + 1];
    for (int i = 0; i < n_ports; i++)
        fds[i] = (struct pollfd){ports[i]->fd, POLLIN, 0};
    fds[n_ports] = (struct pollfd){0, POLLIN, 0};
    while (!stop) {
        int64_t now = now_ns(), next = release(now);
        struct timespec wait, *timeout = NULL;
        if (next != INT64_MAX) {           /* wake WAKE_NS early, then spin to the time */
            int64_t early = pending > SPIN_MAX_PENDING ? 0 : wake_ns;
            int64_t d = next - now - early > 0 ? next - now - early : 0;
            wait = (struct timespec){d / 1000000000, d % 1000000000};
            timeout = &wait;
        }
        int n = ppoll(fds, n_ports + 1, timeout, NULL);
        if (n < 0 && errno != EINTR) { perror("ppoll"); return 1; }
        if (n <= 0) continue;
        if (fds[n_ports].revents) {
            char c;
            if (read(0, &c, 1) <= 0) break;
        }
        for (int i = 0; i < n_ports; i++)
            if (fds[i].revents & POLLIN) read_port(ports[i]);
    }
    for (int i = 0; i < n_ports; i++)
        fprintf(stderr, "netlab_relay: port %d: in %llu out %llu dropped %llu bytes %llu"
                " late mean %.1f us max %.1f us\n", i,
                (unsigned long long)ports[i]->in, (unsigned long long)ports[i]->out,
                (unsigned long long)ports[i]->dropped, (unsigned long long)ports[i]->bytes_out,
                ports[i]->out ? ports[i]->late_sum / 1e3 / ports[i]->out : 0.0,
                ports[i]->late_max / 1e3);
    return 0;
}
