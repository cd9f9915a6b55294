/* A program built against NVIDIA's real libcudart (12.9 or 13.5), as nvcc-built programs use it:
 * it registers a fatbin with one kernel the way nvcc's generated code does, then calls the
 * runtime API. It prints one JSON object per line; tests/clients/tests/cudart.rs judges them
 * against the simulator's ground truth.
 *
 * Usage: cudart_check all [LAUNCHES]     device, memory, kernel, async-pool and graph checks
 *        cudart_check spin MS            launches 1000-block kernels back to back for MS ms
 *        cudart_check init               only asks for the device count (for the integrity test)
 *        cudart_check tables             asks the driver for the runtime's private tables, by
 *                                        dlsym and through cuGetProcAddress, without the runtime
 *
 * With no nvcc here, the fatbin is built by hand: a fatbin header, one member header and the
 * member, a small PTX text. Kernels on simgpu are timed, never run, so the member's content is
 * never compiled.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The runtime API this program uses, declared here: cuda_runtime_api.h needs nvcc's crt/ headers,
 * which the runtime wheels do not carry. These signatures are the same in CUDA 12 and 13. */
typedef int cudaError_t;
typedef struct CUstream_st *cudaStream_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct {
    unsigned x, y, z;
} dim3;
typedef dim3 uint3;
enum { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrComputeCapabilityMajor = 75 };
enum { cudaDevAttrComputeCapabilityMinor = 76, cudaStreamCaptureModeGlobal = 0 };
extern cudaError_t cudaGetDeviceCount(int *count);
extern cudaError_t cudaDeviceGetAttribute(int *value, int attr, int device);
extern cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
extern cudaError_t cudaMalloc(void **p, size_t size);
extern cudaError_t cudaFree(void *p);
extern cudaError_t cudaGetLastError(void);
extern cudaError_t cudaLaunchKernel(const void *f, dim3 grid, dim3 block, void **args,
                                    size_t shared, cudaStream_t s);
extern cudaError_t cudaDeviceSynchronize(void);
extern cudaError_t cudaStreamCreate(cudaStream_t *s);
extern cudaError_t cudaStreamDestroy(cudaStream_t s);
extern cudaError_t cudaStreamSynchronize(cudaStream_t s);
extern cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s);
extern cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
extern cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode);
extern cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
extern cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *x, cudaGraph_t g,
                                                 unsigned long long flags);
extern cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s);
extern cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x);
extern cudaError_t cudaGraphDestroy(cudaGraph_t g);
extern cudaError_t cudaDeviceReset(void);

/* What nvcc's generated host code calls (declared in crt/host_runtime.h). */
extern void **__cudaRegisterFatBinary(void *fatCubin);
extern void __cudaRegisterFatBinaryEnd(void **fatCubinHandle);
extern void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                                   const char *deviceName, int thread_limit, uint3 *tid,
                                   uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize);

/* cudaDeviceProp begins with char name[256], cudaUUID_t uuid, char luid[8], unsigned
 * luidDeviceNodeMask, size_t totalGlobalMem (offset 288) in CUDA 12 (`_v2`) and 13. */
#define PROP_TOTAL_GLOBAL_MEM 288

/* cudaGetDeviceProperties_v2 (CUDA 12) or cudaGetDeviceProperties (CUDA 13). */
static cudaError_t device_properties(void *prop, int dev) {
    typedef cudaError_t (*get_fn)(void *, int);
    get_fn f = (get_fn)dlsym(RTLD_DEFAULT, "cudaGetDeviceProperties_v2");
    if (!f)
        f = (get_fn)dlsym(RTLD_DEFAULT, "cudaGetDeviceProperties");
    return f ? f(prop, dev) : -1;
}

static const char PTX[] = ".version 8.0\n"
                          ".target sm_90\n"
                          ".address_size 64\n"
                          ".visible .entry spin()\n"
                          "{\n"
                          "\tret;\n"
                          "}\n";

#define PTX_PADDED 128
#define MEMBER_HEADER 64

/* The fatbin: its 16-byte header, one 64-byte member header (kind 1 = PTX), the member. */
struct fatbin {
    uint32_t magic;
    uint16_t version;
    uint16_t header_size;
    uint64_t body_size;
    /* member header */
    uint16_t kind;
    uint16_t member_version;
    uint32_t member_header_size;
    uint32_t padded_payload_size;
    uint32_t unknown0;
    uint32_t payload_size;
    uint32_t unknown1;
    uint32_t ptx_version;
    uint32_t sm_version;
    uint32_t name_offset;
    uint32_t name_len;
    uint64_t flags;
    uint64_t unknown2;
    uint64_t uncompressed_size;
    char payload[PTX_PADDED];
} __attribute__((aligned(8)));

static struct fatbin FATBIN = {
    .magic = 0xBA55ED50u,
    .version = 1,
    .header_size = 16,
    .body_size = MEMBER_HEADER + PTX_PADDED,
    .kind = 1,
    .member_version = 0x101,
    .member_header_size = MEMBER_HEADER,
    .padded_payload_size = PTX_PADDED,
    .payload_size = sizeof(PTX),
    .ptx_version = (8 << 16) | 0,
    .sm_version = 90,
    .flags = 0x11, /* 64-bit, Linux */
};

/* __fatBinC_Wrapper_t, version 1: points to one fatbin. */
static struct {
    int magic;
    int version;
    const void *data;
    void *filename_or_fatbins;
} WRAPPER = {0x466243B1, 1, &FATBIN, NULL};

static void **handle;

/* The host-side stub of kernel `spin`: its address names the kernel to the runtime. */
static void spin(void) {}

static void register_kernels(void) {
    memcpy(FATBIN.payload, PTX, sizeof(PTX));
    handle = __cudaRegisterFatBinary(&WRAPPER);
    __cudaRegisterFunction(handle, (const char *)spin, "spin", "spin", -1, NULL, NULL, NULL, NULL,
                           NULL);
    __cudaRegisterFatBinaryEnd(handle);
}

static dim3 d3(unsigned x) {
    dim3 d = {x, 1, 1};
    return d;
}

static int launch(unsigned grid, cudaStream_t s) {
    return (int)cudaLaunchKernel((const void *)spin, d3(grid), d3(1), NULL, 0, s);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* Allocates 128 MiB pieces until refused, then frees them; returns how many fitted. */
static int fill_pieces(int *error, size_t *free_when_full) {
    enum { MAXP = 1024 };
    static void *pieces[MAXP];
    int n = 0;
    *error = 0;
    while (n < MAXP) {
        *error = (int)cudaMalloc(&pieces[n], 128u << 20);
        if (*error != 0)
            break;
        n++;
    }
    cudaGetLastError();
    size_t total = 0;
    cudaMemGetInfo(free_when_full, &total);
    for (int i = 0; i < n; i++)
        cudaFree(pieces[i]);
    return n;
}

static int all(int launches) {
    int count = 0;
    int e = (int)cudaGetDeviceCount(&count);
    static _Alignas(8) char prop[8192];
    int pe = count > 0 ? (int)device_properties(prop, 0) : -1;
    size_t total_mem = 0;
    memcpy(&total_mem, prop + PROP_TOTAL_GLOBAL_MEM, sizeof(total_mem));
    prop[255] = 0;
    int sms = 0, major = 0, minor = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
    printf("{\"event\":\"devices\",\"pid\":%d,\"error\":%d,\"count\":%d,\"props_error\":%d,\"name\":\"%s\","
           "\"totalGlobalMem\":%zu,\"sms\":%d,\"major\":%d,\"minor\":%d}\n",
           (int)getpid(), e, count, pe, prop, total_mem, sms, major, minor);
    if (e != 0 || count == 0)
        return 1;

    size_t free_b = 0, total_b = 0;
    e = (int)cudaMemGetInfo(&free_b, &total_b);
    printf("{\"event\":\"meminfo\",\"error\":%d,\"free\":%zu,\"total\":%zu}\n", e, free_b, total_b);

    /* Beyond what is free at once, then in 128 MiB pieces until refused. */
    void *big = NULL;
    int over = (int)cudaMalloc(&big, free_b + (256u << 20));
    cudaGetLastError();
    int fill = 0;
    size_t free_full = 0;
    int n = fill_pieces(&fill, &free_full);
    printf("{\"event\":\"malloc\",\"over_free_error\":%d,\"pieces\":%d,\"piece_error\":%d,"
           "\"free_when_full\":%zu}\n",
           over, n, fill, free_full);

    register_kernels();
    double t0 = now();
    int le = 0;
    for (int i = 0; i < launches && le == 0; i++)
        le = launch(100, 0);
    int se = (int)cudaDeviceSynchronize();
    printf("{\"event\":\"launch\",\"error\":%d,\"sync_error\":%d,\"launches\":%d,\"blocks\":100,"
           "\"wall_ms\":%.1f}\n",
           le, se, launches, (now() - t0) * 1e3);

    cudaStream_t s;
    int ae = (int)cudaStreamCreate(&s);
    void *a = NULL;
    int ma = ae ? ae : (int)cudaMallocAsync(&a, 64u << 20, s);
    int fa = ma ? ma : (int)cudaFreeAsync(a, s);
    int sa = (int)cudaStreamSynchronize(s);
    /* From the pool, beyond what is free. */
    void *too_big = NULL;
    int oa = (int)cudaMallocAsync(&too_big, free_b + (256u << 20), s);
    cudaStreamSynchronize(s);
    cudaGetLastError();
    printf("{\"event\":\"async\",\"malloc_error\":%d,\"free_error\":%d,\"sync_error\":%d,"
           "\"over_free_error\":%d}\n",
           ma, fa, sa, oa);

    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    int ge = (int)cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    int gl = ge ? ge : launch(100, s);
    int gend = (int)cudaStreamEndCapture(s, &g);
    int gi = gend ? gend : (int)cudaGraphInstantiateWithFlags(&x, g, 0);
    int gr = gi ? gi : (int)cudaGraphLaunch(x, s);
    int gs = (int)cudaStreamSynchronize(s);
    printf("{\"event\":\"graph\",\"capture_error\":%d,\"launch_in_capture\":%d,\"end_error\":%d,"
           "\"instantiate_error\":%d,\"launch_error\":%d,\"sync_error\":%d}\n",
           ge, gl, gend, gi, gr, gs);
    if (x)
        cudaGraphExecDestroy(x);
    if (g)
        cudaGraphDestroy(g);
    cudaStreamDestroy(s);

    /* Resetting the device destroys the primary context (and the runtime's state in it); the
     * runtime must then start afresh. */
    int re = (int)cudaDeviceReset();
    void *after = NULL;
    int ra = (int)cudaMalloc(&after, 1 << 20);
    int rl = launch(100, 0);
    int rs = (int)cudaDeviceSynchronize();
    cudaFree(after);
    size_t free_after = 0, total_after = 0;
    int me = (int)cudaMemGetInfo(&free_after, &total_after);
    int fill_after = 0;
    size_t full_after = 0;
    int n_after = fill_pieces(&fill_after, &full_after);
    printf("{\"event\":\"reset\",\"reset_error\":%d,\"malloc_error\":%d,\"launch_error\":%d,"
           "\"sync_error\":%d,\"meminfo_error\":%d,\"free\":%zu,\"total\":%zu,\"pieces\":%d,"
           "\"piece_error\":%d}\n",
           re, ra, rl, rs, me, free_after, total_after, n_after, fill_after);
    printf("{\"event\":\"done\"}\n");
    return 0;
}

/* Launches 1000-block kernels back to back for `ms` ms of wall time, keeping a few in flight. */
static int spin_for(int ms) {
    register_kernels();
    printf("{\"event\":\"start\",\"pid\":%d}\n", (int)getpid());
    double t0 = now();
    long n = 0;
    int e = 0;
    while (e == 0 && (now() - t0) * 1e3 < ms) {
        e = launch(1000, 0);
        n++;
        if (n % 4 == 0)
            e = e ? e : (int)cudaDeviceSynchronize();
    }
    cudaDeviceSynchronize();
    printf("{\"event\":\"spin\",\"error\":%d,\"launches\":%ld,\"wall_ms\":%.1f}\n", e, n,
           (now() - t0) * 1e3);
    return e != 0;
}

static int init_only(void) {
    int count = -1;
    int e = (int)cudaGetDeviceCount(&count);
    void *p = NULL;
    int m = (int)cudaMalloc(&p, 1 << 20);
    printf("{\"event\":\"init\",\"error\":%d,\"count\":%d,\"malloc_error\":%d}\n", e, count, m);
    return 0;
}

/* Where `p` lies: the file name of the object that holds it and its offset there. */
static void where(const char *key, const void *p, int rc, int last) {
    Dl_info info;
    memset(&info, 0, sizeof(info));
    const char *lib = "";
    unsigned long off = 0;
    if (p && dladdr(p, &info) && info.dli_fname) {
        lib = strrchr(info.dli_fname, '/') ? strrchr(info.dli_fname, '/') + 1 : info.dli_fname;
        off = (unsigned long)((const char *)p - (const char *)info.dli_fbase);
    }
    printf("\"%s\":{\"rc\":%d,\"lib\":\"%s\",\"offset\":%lu}%s", key, rc, lib, off,
           last ? "" : ",");
}

static int tables(void) {
    static const unsigned char ids[][16] = {
        {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9},
        {0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66},
        {0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc},
        {0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93},
        {0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e},
        {0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2},
        {0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2},
    };
    typedef int (*init_fn)(unsigned);
    typedef int (*table_fn)(const void **, const void *);
    typedef int (*proc_fn)(const char *, void **, int, unsigned long long, int *);
    init_fn init = (init_fn)dlsym(RTLD_DEFAULT, "cuInit");
    table_fn direct = (table_fn)dlsym(RTLD_DEFAULT, "cuGetExportTable");
    proc_fn proc = (proc_fn)dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2");
    if (!init || !direct || !proc) {
        /* The runtime loads the driver on its first call. */
        int n;
        cudaGetDeviceCount(&n);
        void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        init = (init_fn)dlsym(cuda ? cuda : RTLD_DEFAULT, "cuInit");
        direct = (table_fn)dlsym(RTLD_DEFAULT, "cuGetExportTable");
        proc = (proc_fn)dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2");
    }
    if (!init || !direct || !proc) {
        printf("{\"event\":\"tables\",\"error\":\"no driver entry points\"}\n");
        return 1;
    }
    int ie = init(0);
    table_fn by_proc = NULL;
    int found = 0;
    int pe = proc("cuGetExportTable", (void **)&by_proc, 12090, 0, &found);
    printf("{\"event\":\"tables\",\"init_error\":%d,\"proc_error\":%d,", ie, pe);
    where("direct_fn", (const void *)direct, 0, 0);
    where("proc_fn", (const void *)by_proc, pe, 0);
    char key[32];
    for (unsigned i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        const void *t = NULL;
        int rc = direct(&t, ids[i]);
        snprintf(key, sizeof(key), "direct_%u", i);
        where(key, t, rc, 0);
        t = NULL;
        rc = by_proc ? by_proc(&t, ids[i]) : -1;
        snprintf(key, sizeof(key), "proc_%u", i);
        where(key, t, rc, i + 1 == sizeof(ids) / sizeof(ids[0]));
    }
    printf("}\n");
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argc > 1 ? argv[1] : "all";
    int n = argc > 2 ? atoi(argv[2]) : 10;
    if (strcmp(mode, "all") == 0)
        return all(n);
    if (strcmp(mode, "spin") == 0)
        return spin_for(n);
    if (strcmp(mode, "init") == 0)
        return init_only();
    if (strcmp(mode, "tables") == 0)
        return tables();
    fprintf(stderr, "cudart_check: unknown mode %s (all, spin, init, tables)\n", mode);
    return 2;
}
