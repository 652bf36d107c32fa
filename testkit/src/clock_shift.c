/* A clock shifted by QW_CLOCK_SHIFT_MS milliseconds for one process, loaded with
 * LD_PRELOAD (see clock.rs): the wall clock (CLOCK_REALTIME, gettimeofday, time)
 * moves, the monotonic clocks do not. The kernel is asked by syscall, so nothing
 * here allocates or calls back into the allocator (jemalloc reads the clock). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long shift_ms(void) {
  static long long shift;
  static int read;
  if (!read) {
    const char *v = getenv("QW_CLOCK_SHIFT_MS");
    shift = v ? atoll(v) : 0;
    read = 1;
  }
  return shift;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
  int r = (int)syscall(SYS_clock_gettime, clock, ts);
  if (r == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
    long long ns = (long long)ts->tv_nsec + (shift_ms() % 1000) * 1000000LL;
    ts->tv_sec += shift_ms() / 1000 + ns / 1000000000LL;
    ns %= 1000000000LL;
    if (ns < 0) { ns += 1000000000LL; ts->tv_sec -= 1; }
    ts->tv_nsec = ns;
  }
  return r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
  (void)tz;
  struct timespec ts;
  int r = clock_gettime(CLOCK_REALTIME, &ts);
  if (r == 0) { tv->tv_sec = ts.tv_sec; tv->tv_usec = ts.tv_nsec / 1000; }
  return r;
}

time_t time(time_t *out) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (out) *out = ts.tv_sec;
  return ts.tv_sec;
}
