/* Steps a process's wall clock: LD_PRELOAD this into redis-server and write a
 * number of seconds (e.g. "0.6") to the file named by $REDLOCK_CLOCK_STEP_FILE;
 * gettimeofday() and CLOCK_REALTIME read that much later from then on. The
 * monotonic clock is left alone, as an NTP step or a resumed VM leaves it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long long step_us(void)
{
    const char *path = getenv("REDLOCK_CLOCK_STEP_FILE");
    double seconds = 0.0;
    FILE *f;
    if (path == NULL || (f = fopen(path, "r")) == NULL)
        return 0;
    if (fscanf(f, "%lf", &seconds) != 1)
        seconds = 0.0;
    fclose(f);
    return (long long)(seconds * 1e6);
}

int gettimeofday(struct timeval *tv, void *tz)
{
    static int (*real)(struct timeval *, void *);
    long long us;
    int rc;
    if (real == NULL)
        real = (int (*)(struct timeval *, void *))dlsym(RTLD_NEXT, "gettimeofday");
    rc = real(tv, tz);
    if (rc == 0 && tv != NULL) {
        us = (long long)tv->tv_sec * 1000000 + tv->tv_usec + step_us();
        tv->tv_sec = us / 1000000;
        tv->tv_usec = us % 1000000;
    }
    return rc;
}

int clock_gettime(clockid_t clock, struct timespec *ts)
{
    static int (*real)(clockid_t, struct timespec *);
    long long ns;
    int rc;
    if (real == NULL)
        real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    rc = real(clock, ts);
    if (rc == 0 && ts != NULL && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        ns = (long long)ts->tv_sec * 1000000000 + ts->tv_nsec + step_us() * 1000;
        ts->tv_sec = ns / 1000000000;
        ts->tv_nsec = ns % 1000000000;
    }
    return rc;
}
