/* What a program that checks a pointer's kind sees of an allocation cuslice spilled: it allocates
 * argv[1] MiB and then argv[2] MiB with cuMemAlloc_v2 (both kept), and prints one line per
 * allocation, "code memory_type is_managed", from cuPointerGetAttribute
 * (CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED). The driver is reached as
 * libcudart reaches it: dlopen and dlsym. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) return 3;
    CUresult (*init)(unsigned) = (CUresult (*)(unsigned))dlsym(cuda, "cuInit");
    CUresult (*retain)(CUcontext *, int) = (CUresult (*)(CUcontext *, int))dlsym(cuda, "cuDevicePrimaryCtxRetain");
    CUresult (*set)(CUcontext) = (CUresult (*)(CUcontext))dlsym(cuda, "cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult (*)(CUdeviceptr *, size_t))dlsym(cuda, "cuMemAlloc_v2");
    CUresult (*attr)(void *, unsigned, CUdeviceptr) = (CUresult (*)(void *, unsigned, CUdeviceptr))dlsym(cuda, "cuPointerGetAttribute");
    if (!init || !retain || !set || !alloc || !attr) return 4;
    CUcontext ctx;
    if (init(0) || retain(&ctx, 0) || set(ctx)) return 5;
    for (int i = 1; i <= 2; i++) {
        CUdeviceptr p = 0;
        unsigned type = 0, managed = 0;
        CUresult r = alloc(&p, (size_t)atoll(argv[i]) << 20);
        if (r == 0) {
            attr(&type, 2 /* MEMORY_TYPE */, p);
            attr(&managed, 8 /* IS_MANAGED */, p);
        }
        printf("%d %u %u\n", r, type, managed);
        fflush(stdout);
    }
    return 0;
}
