/*
 * iodelay.c -- LD_PRELOAD shim that makes file I/O under a path prefix pay
 * the latency and bandwidth of a slower (simulated) disk.
 *
 * Build:  gcc -shared -fPIC -O2 -o libiodelay.so iodelay.c -ldl -lpthread
 * Use:    LD_PRELOAD=/path/libiodelay.so IODELAY_PREFIX=/data/a:/data/b cmd...
 *
 * (profiles.py builds this automatically into a cache dir: build_shim().)
 *
 * ---------------------------------------------------------------------------
 * Environment
 *   IODELAY_PREFIX        ':'-separated directory prefixes. Files whose
 *                         canonical path (readlink /proc/self/fd/N after
 *                         open) is at or below a prefix are "tracked".
 *                         Empty/unset => shim is a pass-through.
 *   IODELAY_READ_LAT_US   per-op latency of a read           (default 0)
 *   IODELAY_WRITE_LAT_US  per-op latency of a write          (default 0)
 *   IODELAY_FSYNC_LAT_US  latency of fsync/fdatasync/
 *                         sync_file_range(WAIT_AFTER)         (default 0)
 *   IODELAY_READ_MBPS     read bandwidth, MB/s (1e6 B/s); 0 = unlimited
 *   IODELAY_WRITE_MBPS    write bandwidth, MB/s; 0 = unlimited
 *   IODELAY_SEEK_US       spinning-disk positioning cost (seek + rotational
 *                         latency) paid by an op that is NOT adjacent to the
 *                         end of the previous op on the device (default 0 =
 *                         no head model)
 *   IODELAY_SERIAL        1 = the device serves one op at a time (HDD: one
 *                         head, latency and seek occupy the device);
 *                         0 = latencies overlap, only the transfer (bytes /
 *                         bandwidth) is serialised (SSD internal parallelism)
 *   IODELAY_SHM           name of a POSIX shm object (e.g. "iodelay-hdd")
 *                         holding the device state, so that all processes
 *                         that use the same name share ONE simulated device
 *                         (bandwidth, queue, head position). Unset => state is
 *                         in an anonymous shared mapping, shared with forked
 *                         children but not across exec.
 *   IODELAY_WRITEBACK_BYTES  after this many bytes written to a tracked fd
 *                         (default 1 MiB, 0 = never), start the real
 *                         writeback of that file asynchronously
 *                         (sync_file_range(SYNC_FILE_RANGE_WRITE)), so that
 *                         the real disk's flush overlaps with the simulated
 *                         write time instead of being added at fsync time.
 *   IODELAY_STATS         if set: at exit, append one JSON line of per-op
 *                         counters and injected delay to this file path
 *                         ("-" or "1" = stderr).
 *
 * ---------------------------------------------------------------------------
 * Model (per tracked op of n bytes at file offset off, arriving at time t0):
 *
 *   seek   = SEEK_US if the device head model is on and (dev,ino,off) is not
 *            the end of the previous tracked op on the device, else 0
 *   xfer   = n / bandwidth
 *   SSD (IODELAY_SERIAL=0):
 *       start = max(t0, device_free); device_free = start + xfer
 *       done  = start + xfer + per-op latency
 *   HDD (IODELAY_SERIAL=1):
 *       start = max(t0, device_free)
 *       done  = start + seek + per-op latency + xfer; device_free = done
 *   fsync: done = max(t0, device_free) + FSYNC_LAT (serial: occupies device)
 *
 *   The real syscall is executed, then the calling thread sleeps until
 *   `done` (absolute CLOCK_MONOTONIC deadline).  The op therefore takes
 *   max(real time, modelled time): the real NVMe disk is much faster than
 *   every simulated profile, so the modelled time dominates.
 *
 *   Delays apply whether or not the data is in the page cache (the model is
 *   "working set larger than RAM / cold cache"); writes are charged when
 *   they are issued (write-through: sustained write throughput is bounded by
 *   the device even though the page cache would absorb short bursts).
 *
 * Intercepted (glibc entry points): open open64 openat openat64 creat creat64
 *   __open_2 __open64_2 __openat_2 __openat64_2, close close_range, dup dup2
 *   dup3 fcntl fcntl64 (F_DUPFD*), read __read_chk pread pread64 __pread_chk
 *   __pread64_chk readv preadv preadv64 preadv2 preadv64v2, write pwrite
 *   pwrite64 writev pwritev pwritev64 pwritev2 pwritev64v2, fsync fdatasync
 *   sync_file_range, copy_file_range sendfile sendfile64, mmap mmap64 (only
 *   counted, never delayed); socket accept accept4 pipe pipe2 socketpair
 *   eventfd epoll_create1 memfd_create fclose only to keep the fd table
 *   honest when fd numbers are reused.
 * NOT covered: stdio (fopen/fread/fwrite use glibc-internal syscalls that an
 *   interposer cannot see), raw syscall(2), io_uring, mmap page faults,
 *   statically linked binaries, fds >= IODELAY_MAXFD, and the JVM if it uses
 *   its own syscall stubs (it does use glibc read/write in practice).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define IODELAY_MAXFD 65536
#define MAX_PREFIXES 16

/* ------------------------------------------------------------------------ */
/* real functions                                                           */

#define DECL(ret, name, args) static ret(*real_##name) args
DECL(int, open, (const char *, int, ...));
DECL(int, open64, (const char *, int, ...));
DECL(int, openat, (int, const char *, int, ...));
DECL(int, openat64, (int, const char *, int, ...));
DECL(int, creat, (const char *, mode_t));
DECL(int, creat64, (const char *, mode_t));
DECL(int, __open_2, (const char *, int));
DECL(int, __open64_2, (const char *, int));
DECL(int, __openat_2, (int, const char *, int));
DECL(int, __openat64_2, (int, const char *, int));
DECL(int, close, (int));
DECL(int, close_range, (unsigned, unsigned, int));
DECL(int, dup, (int));
DECL(int, dup2, (int, int));
DECL(int, dup3, (int, int, int));
DECL(int, fcntl, (int, int, ...));
DECL(int, fcntl64, (int, int, ...));
DECL(ssize_t, read, (int, void *, size_t));
DECL(ssize_t, __read_chk, (int, void *, size_t, size_t));
DECL(ssize_t, pread, (int, void *, size_t, off_t));
DECL(ssize_t, pread64, (int, void *, size_t, off_t));
DECL(ssize_t, __pread_chk, (int, void *, size_t, off_t, size_t));
DECL(ssize_t, __pread64_chk, (int, void *, size_t, off_t, size_t));
DECL(ssize_t, readv, (int, const struct iovec *, int));
DECL(ssize_t, preadv, (int, const struct iovec *, int, off_t));
DECL(ssize_t, preadv64, (int, const struct iovec *, int, off_t));
DECL(ssize_t, preadv2, (int, const struct iovec *, int, off_t, int));
DECL(ssize_t, preadv64v2, (int, const struct iovec *, int, off_t, int));
DECL(ssize_t, write, (int, const void *, size_t));
DECL(ssize_t, pwrite, (int, const void *, size_t, off_t));
DECL(ssize_t, pwrite64, (int, const void *, size_t, off_t));
DECL(ssize_t, writev, (int, const struct iovec *, int));
DECL(ssize_t, pwritev, (int, const struct iovec *, int, off_t));
DECL(ssize_t, pwritev64, (int, const struct iovec *, int, off_t));
DECL(ssize_t, pwritev2, (int, const struct iovec *, int, off_t, int));
DECL(ssize_t, pwritev64v2, (int, const struct iovec *, int, off_t, int));
DECL(int, fsync, (int));
DECL(int, fdatasync, (int));
DECL(int, sync_file_range, (int, off_t, off_t, unsigned int));
DECL(ssize_t, copy_file_range, (int, off_t *, int, off_t *, size_t, unsigned int));
DECL(ssize_t, sendfile, (int, int, off_t *, size_t));
DECL(ssize_t, sendfile64, (int, int, off_t *, size_t));
DECL(void *, mmap, (void *, size_t, int, int, int, off_t));
DECL(void *, mmap64, (void *, size_t, int, int, int, off_t));
DECL(off_t, lseek, (int, off_t, int));
DECL(int, socket, (int, int, int));
DECL(int, accept, (int, struct sockaddr *, socklen_t *));
DECL(int, accept4, (int, struct sockaddr *, socklen_t *, int));
DECL(int, eventfd, (unsigned int, int));
DECL(int, epoll_create1, (int));
DECL(int, memfd_create, (const char *, unsigned int));
DECL(int, pipe, (int[2]));
DECL(int, pipe2, (int[2], int));
DECL(int, socketpair, (int, int, int, int[2]));
DECL(int, fclose, (FILE *));

static void *next_sym(const char *name)
{
    return dlsym(RTLD_NEXT, name);
}

#define RESOLVE(name) real_##name = next_sym(#name)

/* ------------------------------------------------------------------------ */
/* configuration and state                                                  */

static char prefixes[MAX_PREFIXES][PATH_MAX];
static size_t prefix_len[MAX_PREFIXES];
static int n_prefixes;

static uint64_t read_lat_ns, write_lat_ns, fsync_lat_ns, seek_ns;
static double read_ns_per_byte, write_ns_per_byte;
static int serial;
static uint64_t writeback_bytes;

struct fdinfo {
    uint8_t tracked; /* written/read with __atomic */
    uint64_t dev, ino;
    uint64_t unsynced; /* bytes written since the last writeback kick */
};
static struct fdinfo fdtab[IODELAY_MAXFD];

/* device state, in a MAP_SHARED mapping guarded by a robust pshared mutex */
struct device {
    uint64_t magic;          /* 0 uninit, 1 initialising, 2 ready */
    pthread_mutex_t mu;
    uint64_t free_at_ns;     /* device busy until (CLOCK_MONOTONIC ns) */
    uint64_t head_dev, head_ino, head_off;
    int head_valid;
};
static struct device *dev_state;

enum { OP_READ, OP_WRITE, OP_SYNC, OP_NKIND };
static const char *kind_name[OP_NKIND] = {"read", "write", "sync"};
static uint64_t st_ops[OP_NKIND], st_bytes[OP_NKIND], st_delay_ns[OP_NKIND];
static uint64_t st_seeks, st_opens, st_mmaps;
static char stats_path[PATH_MAX];

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int inited;  /* do_init finished */
static int active;  /* prefixes configured and init done */
static __thread int tls_slack_set;
static __thread int tls_in_init;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    return strtoull(v, NULL, 10);
}

static double env_double(const char *name, double dflt)
{
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    return strtod(v, NULL);
}

static void resolve_all(void)
{
    RESOLVE(open); RESOLVE(open64); RESOLVE(openat); RESOLVE(openat64);
    RESOLVE(creat); RESOLVE(creat64); RESOLVE(__open_2); RESOLVE(__open64_2);
    RESOLVE(__openat_2); RESOLVE(__openat64_2);
    RESOLVE(close); RESOLVE(close_range); RESOLVE(dup); RESOLVE(dup2);
    RESOLVE(dup3); RESOLVE(fcntl); RESOLVE(fcntl64);
    RESOLVE(read); RESOLVE(__read_chk); RESOLVE(pread); RESOLVE(pread64);
    RESOLVE(__pread_chk); RESOLVE(__pread64_chk); RESOLVE(readv);
    RESOLVE(preadv); RESOLVE(preadv64); RESOLVE(preadv2); RESOLVE(preadv64v2);
    RESOLVE(write); RESOLVE(pwrite); RESOLVE(pwrite64); RESOLVE(writev);
    RESOLVE(pwritev); RESOLVE(pwritev64); RESOLVE(pwritev2);
    RESOLVE(pwritev64v2); RESOLVE(fsync); RESOLVE(fdatasync);
    RESOLVE(sync_file_range); RESOLVE(copy_file_range); RESOLVE(sendfile);
    RESOLVE(sendfile64); RESOLVE(mmap); RESOLVE(mmap64); RESOLVE(lseek);
    RESOLVE(socket); RESOLVE(accept); RESOLVE(accept4); RESOLVE(eventfd);
    RESOLVE(epoll_create1); RESOLVE(memfd_create); RESOLVE(pipe); RESOLVE(pipe2);
    RESOLVE(socketpair); RESOLVE(fclose);
}

static int path_tracked(const char *p)
{
    for (int i = 0; i < n_prefixes; i++) {
        size_t n = prefix_len[i];
        if (strncmp(p, prefixes[i], n) == 0 && (p[n] == '/' || p[n] == '\0'))
            return 1;
        if (n == 1 && prefixes[i][0] == '/') return 1; /* prefix "/" */
    }
    return 0;
}

/* Decide whether fd refers to a regular file under a prefix; record it. */
static void track_fd(int fd)
{
    if (!active || fd < 0 || fd >= IODELAY_MAXFD) return;
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    int tracked = 0;
    struct stat st;
    if (n > 0) {
        path[n] = '\0';
        if (path[0] == '/' && path_tracked(path) && fstat(fd, &st) == 0 &&
            (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode))) {
            fdtab[fd].dev = st.st_dev;
            fdtab[fd].ino = st.st_ino;
            fdtab[fd].unsynced = 0;
            tracked = 1;
            __atomic_add_fetch(&st_opens, 1, __ATOMIC_RELAXED);
        }
    }
    __atomic_store_n(&fdtab[fd].tracked, (uint8_t)tracked, __ATOMIC_RELEASE);
}

static void untrack_fd(int fd)
{
    if (fd >= 0 && fd < IODELAY_MAXFD)
        __atomic_store_n(&fdtab[fd].tracked, 0, __ATOMIC_RELEASE);
}

static void copy_track(int oldfd, int newfd)
{
    if (newfd < 0 || newfd >= IODELAY_MAXFD) return;
    if (oldfd >= 0 && oldfd < IODELAY_MAXFD &&
        __atomic_load_n(&fdtab[oldfd].tracked, __ATOMIC_ACQUIRE)) {
        fdtab[newfd].dev = fdtab[oldfd].dev;
        fdtab[newfd].ino = fdtab[oldfd].ino;
        __atomic_store_n(&fdtab[newfd].tracked, 1, __ATOMIC_RELEASE);
    } else {
        __atomic_store_n(&fdtab[newfd].tracked, 0, __ATOMIC_RELEASE);
    }
}

static inline int is_tracked(int fd)
{
    return active && fd >= 0 && fd < IODELAY_MAXFD &&
           __atomic_load_n(&fdtab[fd].tracked, __ATOMIC_ACQUIRE);
}

static void device_init(struct device *d)
{
    uint64_t expect = 0;
    if (__atomic_compare_exchange_n(&d->magic, &expect, 1, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        pthread_mutexattr_t a;
        pthread_mutexattr_init(&a);
        pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
        pthread_mutex_init(&d->mu, &a);
        pthread_mutexattr_destroy(&a);
        d->free_at_ns = 0;
        d->head_valid = 0;
        __atomic_store_n(&d->magic, 2, __ATOMIC_RELEASE);
    } else {
        while (__atomic_load_n(&d->magic, __ATOMIC_ACQUIRE) != 2) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
}

static void write_stats(void);

static void do_init(void)
{
    tls_in_init = 1;
    resolve_all();
    const char *pfx = getenv("IODELAY_PREFIX");
    if (pfx && *pfx) {
        char buf[PATH_MAX * 4];
        snprintf(buf, sizeof buf, "%s", pfx);
        char *save = NULL;
        for (char *tok = strtok_r(buf, ":", &save); tok && n_prefixes < MAX_PREFIXES;
             tok = strtok_r(NULL, ":", &save)) {
            char canon[PATH_MAX];
            const char *use = tok;
            if (realpath(tok, canon)) use = canon;
            size_t n = strlen(use);
            while (n > 1 && use[n - 1] == '/') n--;
            if (n == 0 || n >= PATH_MAX) continue;
            memcpy(prefixes[n_prefixes], use, n);
            prefixes[n_prefixes][n] = '\0';
            prefix_len[n_prefixes] = n;
            n_prefixes++;
        }
    }
    read_lat_ns = env_u64("IODELAY_READ_LAT_US", 0) * 1000ull;
    write_lat_ns = env_u64("IODELAY_WRITE_LAT_US", 0) * 1000ull;
    fsync_lat_ns = env_u64("IODELAY_FSYNC_LAT_US", 0) * 1000ull;
    seek_ns = env_u64("IODELAY_SEEK_US", 0) * 1000ull;
    double rb = env_double("IODELAY_READ_MBPS", 0), wb = env_double("IODELAY_WRITE_MBPS", 0);
    read_ns_per_byte = rb > 0 ? 1e9 / (rb * 1e6) : 0;
    write_ns_per_byte = wb > 0 ? 1e9 / (wb * 1e6) : 0;
    serial = (int)env_u64("IODELAY_SERIAL", 0);
    writeback_bytes = env_u64("IODELAY_WRITEBACK_BYTES", 1u << 20);
    const char *sp = getenv("IODELAY_STATS");
    if (sp && *sp) snprintf(stats_path, sizeof stats_path, "%s", sp);

    if (n_prefixes == 0) goto out;

    void *m = MAP_FAILED;
    const char *shm = getenv("IODELAY_SHM");
    if (shm && *shm) {
        char name[NAME_MAX];
        snprintf(name, sizeof name, "%s%s", shm[0] == '/' ? "" : "/", shm);
        int fd = shm_open(name, O_RDWR | O_CREAT, 0600);
        if (fd >= 0) {
            if (ftruncate(fd, sizeof(struct device)) == 0)
                m = real_mmap(NULL, sizeof(struct device), PROT_READ | PROT_WRITE,
                              MAP_SHARED, fd, 0);
            real_close(fd);
        }
    }
    if (m == MAP_FAILED)
        m = real_mmap(NULL, sizeof(struct device), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) goto out;
    dev_state = m;
    device_init(dev_state);

    /* fds inherited across exec: scan /proc/self/fd once */
    active = 1;
    DIR *dir = opendir("/proc/self/fd");
    if (dir) {
        int dfd = dirfd(dir);
        struct dirent *e;
        while ((e = readdir(dir))) {
            if (e->d_name[0] == '.') continue;
            int fd = atoi(e->d_name);
            if (fd != dfd) track_fd(fd);
        }
        closedir(dir);
    }
    if (stats_path[0]) atexit(write_stats);
out:
    __atomic_store_n(&inited, 1, __ATOMIC_RELEASE);
    tls_in_init = 0;
}

static inline void init(void)
{
    if (__builtin_expect(!__atomic_load_n(&inited, __ATOMIC_ACQUIRE), 0)) {
        if (tls_in_init) {
            if (!real_read) resolve_all(); /* re-entered from our own init */
        } else {
            pthread_once(&init_once, do_init);
        }
    }
}

__attribute__((constructor)) static void ctor(void)
{
    pthread_once(&init_once, do_init);
}

static void lock_dev(void)
{
    int r = pthread_mutex_lock(&dev_state->mu);
    if (r == EOWNERDEAD) pthread_mutex_consistent(&dev_state->mu);
}

static void sleep_until(uint64_t deadline)
{
    if (!tls_slack_set) {
        /* default 50us timer slack would inflate every sub-ms delay */
        prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
        tls_slack_set = 1;
    }
    struct timespec ts = {(time_t)(deadline / 1000000000ull),
                          (long)(deadline % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/*
 * Account one op on a tracked fd.  off < 0 means "offset unknown": treated
 * as sequential for the head model.  Returns the absolute completion time.
 */
static uint64_t model(int fd, int kind, int64_t off, uint64_t n, uint64_t t0)
{
    uint64_t lat = 0, xfer = 0, seek = 0;
    if (kind == OP_READ) {
        lat = read_lat_ns;
        xfer = (uint64_t)(n * read_ns_per_byte);
    } else if (kind == OP_WRITE) {
        lat = write_lat_ns;
        xfer = (uint64_t)(n * write_ns_per_byte);
    } else {
        lat = fsync_lat_ns;
    }
    uint64_t dev = fdtab[fd].dev, ino = fdtab[fd].ino;
    uint64_t done;
    lock_dev();
    struct device *d = dev_state;
    if (seek_ns && kind != OP_SYNC) {
        int seq = d->head_valid && d->head_dev == dev && d->head_ino == ino &&
                  (off < 0 || (uint64_t)off == d->head_off);
        if (!seq) {
            seek = seek_ns;
            st_seeks++; /* under device lock within this process's view */
        }
        d->head_valid = 1;
        d->head_dev = dev;
        d->head_ino = ino;
        d->head_off = (off < 0 ? d->head_off : (uint64_t)off) + n;
    }
    uint64_t start = d->free_at_ns > t0 ? d->free_at_ns : t0;
    if (serial || kind == OP_SYNC) {
        done = start + seek + lat + xfer;
        d->free_at_ns = done;
    } else {
        d->free_at_ns = start + xfer;
        done = start + xfer + lat + seek;
    }
    pthread_mutex_unlock(&d->mu);

    __atomic_add_fetch(&st_ops[kind], 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&st_bytes[kind], n, __ATOMIC_RELAXED);
    __atomic_add_fetch(&st_delay_ns[kind], done - t0, __ATOMIC_RELAXED);
    return done;
}

static void charge(int fd, int kind, int64_t off, uint64_t n, uint64_t t0)
{
    if (kind != OP_SYNC && n == 0) return;
    uint64_t done = model(fd, kind, off, n, t0);
    if (kind == OP_WRITE && writeback_bytes &&
        __atomic_add_fetch(&fdtab[fd].unsynced, n, __ATOMIC_RELAXED) >= writeback_bytes) {
        /* The simulated device has just been charged for these bytes, but the
         * real page cache would write them back only at fsync time, adding
         * the real disk's flush time on top of the simulated cost.  Start the
         * real writeback now (asynchronous), so it overlaps with our sleep. */
        __atomic_store_n(&fdtab[fd].unsynced, 0, __ATOMIC_RELAXED);
        real_sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
    }
    if (done > now_ns()) sleep_until(done);
}

/* offset of an op that just moved the file position by n bytes */
static int64_t pos_before(int fd, ssize_t n)
{
    if (!seek_ns) return -1;
    int saved = errno;
    off_t p = real_lseek(fd, 0, SEEK_CUR);
    errno = saved;
    if (p < 0) return -1;
    return (int64_t)p - (int64_t)n;
}

static void write_stats(void)
{
    FILE *f = NULL;
    int own = 0;
    if (!st_opens && !st_ops[OP_READ] && !st_ops[OP_WRITE] && !st_ops[OP_SYNC])
        return; /* nothing tracked in this process */
    if (strcmp(stats_path, "-") == 0 || strcmp(stats_path, "1") == 0) f = stderr;
    else {
        f = fopen(stats_path, "a"); /* stdio: not intercepted */
        own = 1;
    }
    if (!f) return;
    fprintf(f, "{\"pid\": %d, \"opens\": %llu, \"mmaps\": %llu, \"seeks\": %llu",
            (int)getpid(), (unsigned long long)st_opens,
            (unsigned long long)st_mmaps, (unsigned long long)st_seeks);
    for (int k = 0; k < OP_NKIND; k++)
        fprintf(f, ", \"%s_ops\": %llu, \"%s_bytes\": %llu, \"%s_delay_s\": %.6f",
                kind_name[k], (unsigned long long)st_ops[k], kind_name[k],
                (unsigned long long)st_bytes[k], kind_name[k], st_delay_ns[k] / 1e9);
    fprintf(f, "}\n");
    if (own) fclose(f);
    else fflush(f);
}

/* ------------------------------------------------------------------------ */
/* open / close / dup                                                       */

static int needs_mode(int flags)
{
    return (flags & O_CREAT) || ((flags & O_TMPFILE) == O_TMPFILE);
}

#define OPEN_WRAPPER(name)                                                   \
    int name(const char *path, int flags, ...)                               \
    {                                                                        \
        init();                                                              \
        mode_t mode = 0;                                                     \
        if (needs_mode(flags)) {                                             \
            va_list ap;                                                      \
            va_start(ap, flags);                                             \
            mode = va_arg(ap, mode_t);                                       \
            va_end(ap);                                                      \
        }                                                                    \
        int fd = real_##name(path, flags, mode);                             \
        if (fd >= 0) {                                                       \
            int e = errno;                                                   \
            track_fd(fd);                                                    \
            errno = e;                                                       \
        }                                                                    \
        return fd;                                                           \
    }
OPEN_WRAPPER(open)
OPEN_WRAPPER(open64)

#define OPENAT_WRAPPER(name)                                                 \
    int name(int atfd, const char *path, int flags, ...)                     \
    {                                                                        \
        init();                                                              \
        mode_t mode = 0;                                                     \
        if (needs_mode(flags)) {                                             \
            va_list ap;                                                      \
            va_start(ap, flags);                                             \
            mode = va_arg(ap, mode_t);                                       \
            va_end(ap);                                                      \
        }                                                                    \
        int fd = real_##name(atfd, path, flags, mode);                      \
        if (fd >= 0) {                                                       \
            int e = errno;                                                   \
            track_fd(fd);                                                    \
            errno = e;                                                       \
        }                                                                    \
        return fd;                                                           \
    }
OPENAT_WRAPPER(openat)
OPENAT_WRAPPER(openat64)

#define SIMPLE_OPEN(name, params, args)                                      \
    int name params                                                          \
    {                                                                        \
        init();                                                              \
        int fd = real_##name args;                                           \
        if (fd >= 0) {                                                       \
            int e = errno;                                                   \
            track_fd(fd);                                                    \
            errno = e;                                                       \
        }                                                                    \
        return fd;                                                           \
    }
SIMPLE_OPEN(creat, (const char *p, mode_t m), (p, m))
SIMPLE_OPEN(creat64, (const char *p, mode_t m), (p, m))
SIMPLE_OPEN(__open_2, (const char *p, int f), (p, f))
SIMPLE_OPEN(__open64_2, (const char *p, int f), (p, f))
SIMPLE_OPEN(__openat_2, (int d, const char *p, int f), (d, p, f))
SIMPLE_OPEN(__openat64_2, (int d, const char *p, int f), (d, p, f))

int close(int fd)
{
    init();
    untrack_fd(fd); /* before the real close: the number may be reused at once */
    return real_close(fd);
}

int close_range(unsigned first, unsigned last, int flags)
{
    init();
    int r = real_close_range(first, last, flags);
    if (r == 0 && !(flags & CLOSE_RANGE_CLOEXEC)) {
        /* CLOSE_RANGE_UNSHARE only affects the fd table copy; same numbers */
        for (unsigned fd = first; fd <= last && fd < IODELAY_MAXFD; fd++)
            untrack_fd((int)fd);
    }
    return r;
}

int dup(int oldfd)
{
    init();
    int fd = real_dup(oldfd);
    if (fd >= 0) copy_track(oldfd, fd);
    return fd;
}

int dup2(int oldfd, int newfd)
{
    init();
    int fd = real_dup2(oldfd, newfd);
    if (fd >= 0) copy_track(oldfd, fd);
    return fd;
}

int dup3(int oldfd, int newfd, int flags)
{
    init();
    int fd = real_dup3(oldfd, newfd, flags);
    if (fd >= 0) copy_track(oldfd, fd);
    return fd;
}

#define FCNTL_WRAPPER(name)                                                  \
    int name(int fd, int cmd, ...)                                           \
    {                                                                        \
        init();                                                              \
        va_list ap;                                                          \
        va_start(ap, cmd);                                                   \
        void *arg = va_arg(ap, void *);                                      \
        va_end(ap);                                                          \
        int r = real_##name(fd, cmd, arg);                                   \
        if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC))            \
            copy_track(fd, r);                                               \
        return r;                                                            \
    }
FCNTL_WRAPPER(fcntl)
FCNTL_WRAPPER(fcntl64)

/* Other fd producers: a number that was tracked but closed through a path we
 * cannot see (e.g. glibc-internal close) must not stay tracked when reused
 * for a socket/pipe/etc. */
#define NEWFD_WRAPPER(name, params, args)                                    \
    int name params                                                          \
    {                                                                        \
        init();                                                              \
        int fd = real_##name args;                                           \
        if (fd >= 0) untrack_fd(fd);                                         \
        return fd;                                                           \
    }
NEWFD_WRAPPER(socket, (int d, int t, int p), (d, t, p))
NEWFD_WRAPPER(accept, (int s, struct sockaddr *a, socklen_t *l), (s, a, l))
NEWFD_WRAPPER(accept4, (int s, struct sockaddr *a, socklen_t *l, int f), (s, a, l, f))
NEWFD_WRAPPER(eventfd, (unsigned int v, int f), (v, f))
NEWFD_WRAPPER(epoll_create1, (int f), (f))
NEWFD_WRAPPER(memfd_create, (const char *n, unsigned int f), (n, f))

int pipe(int fds[2])
{
    init();
    int r = real_pipe(fds);
    if (r == 0) { untrack_fd(fds[0]); untrack_fd(fds[1]); }
    return r;
}

int pipe2(int fds[2], int flags)
{
    init();
    int r = real_pipe2(fds, flags);
    if (r == 0) { untrack_fd(fds[0]); untrack_fd(fds[1]); }
    return r;
}

int socketpair(int d, int t, int p, int sv[2])
{
    init();
    int r = real_socketpair(d, t, p, sv);
    if (r == 0) { untrack_fd(sv[0]); untrack_fd(sv[1]); }
    return r;
}

/* fclose closes through a glibc-internal path; untrack first (fdopen'd fds) */
int fclose(FILE *f)
{
    init();
    if (f) untrack_fd(fileno(f));
    return real_fclose(f);
}

/* ------------------------------------------------------------------------ */
/* data path                                                                */

/* positional I/O: offset known */
#define P_WRAPPER(ret, name, kind, params, args, offexpr)                    \
    ret name params                                                          \
    {                                                                        \
        init();                                                              \
        if (!is_tracked(fd)) return real_##name args;                        \
        uint64_t t0 = now_ns();                                              \
        ret r = real_##name args;                                            \
        if (r > 0) {                                                         \
            int e = errno;                                                   \
            charge(fd, kind, (int64_t)(offexpr), (uint64_t)r, t0);           \
            errno = e;                                                       \
        }                                                                    \
        return r;                                                            \
    }

/* stream I/O: offset = file position before the op (for the head model) */
#define S_WRAPPER(ret, name, kind, params, args)                             \
    ret name params                                                          \
    {                                                                        \
        init();                                                              \
        if (!is_tracked(fd)) return real_##name args;                        \
        uint64_t t0 = now_ns();                                              \
        ret r = real_##name args;                                            \
        if (r > 0) {                                                         \
            int e = errno;                                                   \
            charge(fd, kind, pos_before(fd, r), (uint64_t)r, t0);            \
            errno = e;                                                       \
        }                                                                    \
        return r;                                                            \
    }

S_WRAPPER(ssize_t, read, OP_READ, (int fd, void *b, size_t n), (fd, b, n))
S_WRAPPER(ssize_t, __read_chk, OP_READ, (int fd, void *b, size_t n, size_t bl), (fd, b, n, bl))
S_WRAPPER(ssize_t, readv, OP_READ, (int fd, const struct iovec *v, int c), (fd, v, c))
S_WRAPPER(ssize_t, write, OP_WRITE, (int fd, const void *b, size_t n), (fd, b, n))
S_WRAPPER(ssize_t, writev, OP_WRITE, (int fd, const struct iovec *v, int c), (fd, v, c))

P_WRAPPER(ssize_t, pread, OP_READ, (int fd, void *b, size_t n, off_t o), (fd, b, n, o), o)
P_WRAPPER(ssize_t, pread64, OP_READ, (int fd, void *b, size_t n, off_t o), (fd, b, n, o), o)
P_WRAPPER(ssize_t, __pread_chk, OP_READ, (int fd, void *b, size_t n, off_t o, size_t bl), (fd, b, n, o, bl), o)
P_WRAPPER(ssize_t, __pread64_chk, OP_READ, (int fd, void *b, size_t n, off_t o, size_t bl), (fd, b, n, o, bl), o)
P_WRAPPER(ssize_t, preadv, OP_READ, (int fd, const struct iovec *v, int c, off_t o), (fd, v, c, o), o)
P_WRAPPER(ssize_t, preadv64, OP_READ, (int fd, const struct iovec *v, int c, off_t o), (fd, v, c, o), o)
/* preadv2/pwritev2 with offset -1 use (and advance) the file position */
P_WRAPPER(ssize_t, preadv2, OP_READ, (int fd, const struct iovec *v, int c, off_t o, int fl), (fd, v, c, o, fl), o == -1 ? -1 : o)
P_WRAPPER(ssize_t, preadv64v2, OP_READ, (int fd, const struct iovec *v, int c, off_t o, int fl), (fd, v, c, o, fl), o == -1 ? -1 : o)
P_WRAPPER(ssize_t, pwrite, OP_WRITE, (int fd, const void *b, size_t n, off_t o), (fd, b, n, o), o)
P_WRAPPER(ssize_t, pwrite64, OP_WRITE, (int fd, const void *b, size_t n, off_t o), (fd, b, n, o), o)
P_WRAPPER(ssize_t, pwritev, OP_WRITE, (int fd, const struct iovec *v, int c, off_t o), (fd, v, c, o), o)
P_WRAPPER(ssize_t, pwritev64, OP_WRITE, (int fd, const struct iovec *v, int c, off_t o), (fd, v, c, o), o)
P_WRAPPER(ssize_t, pwritev2, OP_WRITE, (int fd, const struct iovec *v, int c, off_t o, int fl), (fd, v, c, o, fl), o == -1 ? -1 : o)
P_WRAPPER(ssize_t, pwritev64v2, OP_WRITE, (int fd, const struct iovec *v, int c, off_t o, int fl), (fd, v, c, o, fl), o == -1 ? -1 : o)

#define SYNC_WRAPPER(name)                                                   \
    int name(int fd)                                                         \
    {                                                                        \
        init();                                                              \
        if (!is_tracked(fd)) return real_##name(fd);                         \
        uint64_t t0 = now_ns();                                              \
        int r = real_##name(fd);                                             \
        int e = errno;                                                       \
        charge(fd, OP_SYNC, -1, 0, t0);                                      \
        errno = e;                                                           \
        return r;                                                            \
    }
SYNC_WRAPPER(fsync)
SYNC_WRAPPER(fdatasync)

int sync_file_range(int fd, off_t off, off_t n, unsigned int flags)
{
    init();
    if (!is_tracked(fd) || !(flags & SYNC_FILE_RANGE_WAIT_AFTER))
        return real_sync_file_range(fd, off, n, flags);
    uint64_t t0 = now_ns();
    int r = real_sync_file_range(fd, off, n, flags);
    int e = errno;
    charge(fd, OP_SYNC, -1, 0, t0);
    errno = e;
    return r;
}

/* in-kernel copies: charge a read on the source and a write on the target */
static void charge_copy(int in_fd, int out_fd, ssize_t r, uint64_t t0)
{
    if (r <= 0) return;
    int e = errno;
    if (is_tracked(in_fd)) charge(in_fd, OP_READ, -1, (uint64_t)r, t0);
    if (is_tracked(out_fd)) charge(out_fd, OP_WRITE, -1, (uint64_t)r, t0);
    errno = e;
}

ssize_t copy_file_range(int in_fd, off_t *in_off, int out_fd, off_t *out_off,
                        size_t len, unsigned int flags)
{
    init();
    uint64_t t0 = now_ns();
    ssize_t r = real_copy_file_range(in_fd, in_off, out_fd, out_off, len, flags);
    charge_copy(in_fd, out_fd, r, t0);
    return r;
}

ssize_t sendfile(int out_fd, int in_fd, off_t *off, size_t count)
{
    init();
    uint64_t t0 = now_ns();
    ssize_t r = real_sendfile(out_fd, in_fd, off, count);
    charge_copy(in_fd, out_fd, r, t0);
    return r;
}

ssize_t sendfile64(int out_fd, int in_fd, off_t *off, size_t count)
{
    init();
    uint64_t t0 = now_ns();
    ssize_t r = real_sendfile64(out_fd, in_fd, off, count);
    charge_copy(in_fd, out_fd, r, t0);
    return r;
}

/* mmap: not delayed (page faults are invisible to a shim); counted so that a
 * probe can verify e.g. that RocksDB does not use mmap reads. */
void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    if (!real_mmap) real_mmap = next_sym("mmap");
    if (active && fd >= 0 && is_tracked(fd))
        __atomic_add_fetch(&st_mmaps, 1, __ATOMIC_RELAXED);
    return real_mmap(addr, len, prot, flags, fd, off);
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    if (!real_mmap64) real_mmap64 = next_sym("mmap64");
    if (active && fd >= 0 && is_tracked(fd))
        __atomic_add_fetch(&st_mmaps, 1, __ATOMIC_RELAXED);
    return real_mmap64(addr, len, prot, flags, fd, off);
}
