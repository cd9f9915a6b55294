/* Contexts that go away with allocations still in them: the driver frees those allocations, and
 * a slice must get them back, those of the context that went away and no others. Under a 6 GiB
 * cap, on device 0, reached as libcudart reaches the driver (dlopen and dlsym), it prints one
 * line per step, "step code" (0: CUDA_SUCCESS, 2: CUDA_ERROR_OUT_OF_MEMORY):
 *   a2     2 GiB in context A (created)
 *   b1     1 GiB in context B (created after A, so current)
 *   b4     4 GiB more in B while A holds its 2 GiB: past the cap
 *   destroy_a  cuCtxDestroy(A), its 2 GiB never freed
 *   b4     4 GiB more in B: within the cap only if A's 2 GiB came back
 *   b1     1 GiB more in B: past the cap (B's own 5 GiB are still charged)
 *   destroy_b  cuCtxDestroy(B)
 *   p5     5 GiB in the primary context
 *   reset  cuDevicePrimaryCtxReset_v2, its 5 GiB never freed
 *   p5     5 GiB in the primary context, retained again
 *   p1     1 GiB more there: past the cap */
#include <dlfcn.h>
#include <stdio.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;

#define GIB ((size_t)1 << 30)

static CUresult (*alloc)(CUdeviceptr *, size_t);

static void step(const char *name, CUresult r) {
    printf("%s %d\n", name, r);
    fflush(stdout);
}

static void allocate(const char *name, size_t gib) {
    CUdeviceptr p = 0;
    step(name, alloc(&p, gib * GIB));
}

int main(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) return 3;
    CUresult (*init)(unsigned) = (CUresult (*)(unsigned))dlsym(cuda, "cuInit");
    CUresult (*create)(CUcontext *, unsigned, int) = (CUresult (*)(CUcontext *, unsigned, int))dlsym(cuda, "cuCtxCreate_v2");
    CUresult (*destroy)(CUcontext) = (CUresult (*)(CUcontext))dlsym(cuda, "cuCtxDestroy_v2");
    CUresult (*set)(CUcontext) = (CUresult (*)(CUcontext))dlsym(cuda, "cuCtxSetCurrent");
    CUresult (*retain)(CUcontext *, int) = (CUresult (*)(CUcontext *, int))dlsym(cuda, "cuDevicePrimaryCtxRetain");
    CUresult (*reset)(int) = (CUresult (*)(int))dlsym(cuda, "cuDevicePrimaryCtxReset_v2");
    alloc = (CUresult (*)(CUdeviceptr *, size_t))dlsym(cuda, "cuMemAlloc_v2");
    if (!init || !create || !destroy || !set || !retain || !reset || !alloc) return 4;
    CUcontext a, b, p;
    if (init(0) || create(&a, 0, 0)) return 5;
    allocate("a2", 2);
    if (create(&b, 0, 0)) return 6;
    allocate("b1", 1);
    allocate("b4", 4);
    step("destroy_a", destroy(a));
    allocate("b4", 4);
    allocate("b1", 1);
    step("destroy_b", destroy(b));
    if (retain(&p, 0) || set(p)) return 7;
    allocate("p5", 5);
    step("reset", reset(0));
    if (retain(&p, 0) || set(p)) return 8;
    allocate("p5", 5);
    allocate("p1", 1);
    return 0;
}
