/* A preloaded library that wraps getpid() the usual way: dlsym(RTLD_NEXT, "getpid"). If a dlsym
 * override made RTLD_NEXT relative to itself instead of to this library, the lookup would find
 * this very function and recurse until the stack overflows. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/types.h>

pid_t getpid(void) {
    pid_t (*next)(void) = (pid_t (*)(void))dlsym(RTLD_NEXT, "getpid");
    if (next == getpid) return -1;
    return next ? next() : -2;
}
