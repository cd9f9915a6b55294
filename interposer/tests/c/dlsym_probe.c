/* Prints, for each name, where dlsym(handle-of-libcuda, name) lands: "cuslice", "driver",
 * "null", or "other". Also the result of a plain getpid() (wrapped by next_wrapper.so when that is
 * preloaded too) and of dlsym(RTLD_DEFAULT, ...) for a wrapped and an unwrapped driver name. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *where(void *p) {
    Dl_info info;
    if (!p) return "null";
    if (!dladdr(p, &info) || !info.dli_fname) return "other";
    if (strstr(info.dli_fname, "libcuslice")) return "cuslice";
    if (strstr(info.dli_fname, "libcuda")) return "driver";
    return "other";
}

int main(int argc, char **argv) {
    /* Global, as a program linked with -lcuda has it: RTLD_DEFAULT finds the driver's names. */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) { printf("dlopen failed: %s\n", dlerror()); return 1; }
    for (int i = 1; i < argc; i++) {
        dlerror();
        void *p = dlsym(h, argv[i]);
        const char *err = dlerror();
        printf("%s %s%s\n", argv[i], where(p), (!p && err) ? " dlerror" : "");
    }
    printf("getpid %s\n", getpid() > 0 ? "ok" : "broken");
    printf("RTLD_DEFAULT:cuMemAlloc_v2 %s\n", where(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2")));
    printf("RTLD_DEFAULT:cuDeviceGetName %s\n", where(dlsym(RTLD_DEFAULT, "cuDeviceGetName")));
    return 0;
}
