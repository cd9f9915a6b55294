/* A library that calls the driver directly (linked with -lcuda), opened with dlopen before the
 * process has touched CUDA, and a process that forks before its first CUDA call: the routes
 * where the first call into CUDA reaches cuslice's loader through exported symbols, in a
 * process (and a child) that has not loaded the interposer's core yet.
 *
 * libuser.so (built from this file with -DLIBUSER) exports user_alloc(bytes): initialise, make
 * the primary context current, allocate `bytes` and keep it; returns the CUresult. The program
 * (built without -DLIBUSER) dlopens libuser.so (argv[1]), forks; the child allocates argv[2]
 * MiB, reports, and waits; the parent then allocates argv[2] MiB (reports), lets the child go,
 * waits for it, and allocates argv[2] MiB once more (reports). Reports are "who code" lines. */
#define _GNU_SOURCE
#include <stddef.h>

#ifdef LIBUSER
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
CUresult cuInit(unsigned flags);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, int dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes);

int user_alloc(size_t bytes) {
    static CUcontext ctx;
    CUresult r;
    if (!ctx) {
        if ((r = cuInit(0)) != 0) return r;
        if ((r = cuDevicePrimaryCtxRetain(&ctx, 0)) != 0) return r;
        if ((r = cuCtxSetCurrent(ctx)) != 0) return r;
    }
    CUdeviceptr p;
    return cuMemAlloc_v2(&p, bytes);
}
#else
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { printf("dlopen failed: %s\n", dlerror()); return 1; }
    int (*user_alloc)(size_t) = (int (*)(size_t))dlsym(h, "user_alloc");
    size_t bytes = strtoull(argv[2], NULL, 10) << 20;
    int ready[2], go[2];
    if (pipe(ready) || pipe(go)) return 1;
    pid_t child = fork();
    if (child == 0) {
        printf("child %d\n", user_alloc(bytes));
        fflush(stdout);
        char c = 0;
        if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) != 1) return 1;
        return 0;
    }
    char c;
    if (read(ready[0], &c, 1) != 1) return 1;
    printf("parent-beside-child %d\n", user_alloc(bytes));
    fflush(stdout);
    if (write(go[1], &c, 1) != 1) return 1;
    int status;
    waitpid(child, &status, 0);
    printf("parent-alone %d\n", user_alloc(bytes));
    return 0;
}
#endif
