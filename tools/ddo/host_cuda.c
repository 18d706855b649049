/*
 * host_cuda.c - the cuda back end of the reference host: every 2-D BF16, F16
 * or F32 weight W [out, in] of a unit is applied as Y = X W^T with cuBLASLt
 * (F32 compute and scale) on the host's compute stream, which the session
 * has made wait on the unit's upload events.
 *
 * cuBLASLt is loaded at run time with dlopen/dlsym (the tool links only
 * libddo): libcublasLt.so.13, then .12, then libcublasLt.so. The few driver
 * calls the tool needs come from the library (ddo__cuda_driver_proc: the
 * driver the library's cuda device opens, libcuda.so.1, through
 * cuGetProcAddress at the library's pinned ABI), so there is one driver
 * loader in the tree.
 *
 * Activations: one X [tokens, in] per (dtype, in) pair, element i being
 * ref_activation(in, i), generated on the host and uploaded once at create;
 * they are exact in every input dtype. The GEMM configuration of a shape
 * (layouts, descriptor, algorithm chosen once by the heuristic) is fixed at
 * create, so a resident and a streamed run compute bit-identical outputs
 * (cuBLASLt is bitwise reproducible for a fixed algorithm on one GPU model).
 *
 * Timing mode (checksum off): outputs in the weight's dtype, kept on the
 * device. Checksum mode: outputs in F32; after each product a few evenly
 * spaced rows of Y (every output column is covered: a wrong weight byte in
 * row j changes Y[r, j]) are copied on the same stream into pinned host
 * memory and folded at ref_host_cuda_step_checksum: per weight
 * ref_checksum_floats over its sampled rows, per step ref_checksum_u64 of
 * each weight's fold in run order. The cuda checksums are comparable with
 * each other, not with the cpu back end's.
 *
 * FP8, integer and non-2-D tensors are moved as bytes; their compute is
 * skipped and counted (weights_skipped).
 */
#include "host.h"
#include "tool.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Bench helpers (declared in cmd_bench.c until host.h carries them). */
int ref_host_cuda_bus_bandwidth(ddo_stream *stream, uint64_t total_bytes, size_t piece_bytes,
                                double *bytes_per_s, char *err, size_t err_len);
int ref_host_cuda_stream_callback(ddo_stream *stream, void (*fn)(void *), void *user, char *err,
                                  size_t err_len);

#if DDO_HAVE_CUDA_H

#    include <cublasLt.h>
#    include <cuda.h>
#    include <cudaTypedefs.h>
#    if defined(_WIN32)
#        include "compat.h"
#    else
#        include <dlfcn.h>
#    endif

/* Rows of Y sampled per weight in checksum mode. */
#    define SAMPLE_ROWS 4
/* cuBLASLt workspace. */
#    define WORKSPACE_BYTES ((size_t)32 << 20)

/* ---- the driver calls of the tool (from the library: ddo__cuda_driver_proc) ---- */

/* The ABI the entry points are asked for (the PFN_ types below match it), as the library's. */
#    define TOOL_CU_ABI 12000

typedef struct tool_cu {
    PFN_cuGetErrorName_v6000 GetErrorName;
    PFN_cuCtxGetCurrent_v4000 CtxGetCurrent;
    PFN_cuCtxSetCurrent_v4000 CtxSetCurrent;
    PFN_cuMemAlloc_v3020 MemAlloc;
    PFN_cuMemFree_v3020 MemFree;
    PFN_cuMemcpyHtoD_v3020 MemcpyHtoD;
    PFN_cuMemcpyHtoDAsync_v3020 MemcpyHtoDAsync;
    PFN_cuMemcpyDtoHAsync_v3020 MemcpyDtoHAsync;
    PFN_cuMemHostAlloc_v2020 MemHostAlloc;
    PFN_cuMemFreeHost_v2000 MemFreeHost;
    PFN_cuStreamSynchronize_v2000 StreamSynchronize;
    PFN_cuLaunchHostFunc_v10000 LaunchHostFunc;
} tool_cu;

typedef struct tool_lt {
    cublasStatus_t (*Create)(cublasLtHandle_t *);
    cublasStatus_t (*Destroy)(cublasLtHandle_t);
    const char *(*GetStatusName)(cublasStatus_t);
    size_t (*GetVersion)(void);
    cublasStatus_t (*MatmulDescCreate)(cublasLtMatmulDesc_t *, cublasComputeType_t, cudaDataType_t);
    cublasStatus_t (*MatmulDescDestroy)(cublasLtMatmulDesc_t);
    cublasStatus_t (*MatmulDescSetAttribute)(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t,
                                             const void *, size_t);
    cublasStatus_t (*MatrixLayoutCreate)(cublasLtMatrixLayout_t *, cudaDataType, uint64_t, uint64_t,
                                         int64_t);
    cublasStatus_t (*MatrixLayoutDestroy)(cublasLtMatrixLayout_t);
    cublasStatus_t (*MatmulPreferenceCreate)(cublasLtMatmulPreference_t *);
    cublasStatus_t (*MatmulPreferenceDestroy)(cublasLtMatmulPreference_t);
    cublasStatus_t (*MatmulPreferenceSetAttribute)(cublasLtMatmulPreference_t,
                                                   cublasLtMatmulPreferenceAttributes_t,
                                                   const void *, size_t);
    cublasStatus_t (*MatmulAlgoGetHeuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t,
                                             cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                             cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                             cublasLtMatmulPreference_t, int,
                                             cublasLtMatmulHeuristicResult_t[], int *);
    cublasStatus_t (*Matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *,
                             cublasLtMatrixLayout_t, const void *, cublasLtMatrixLayout_t,
                             const void *, const void *, cublasLtMatrixLayout_t, void *,
                             cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *, void *, size_t,
                             cudaStream_t);
} tool_lt;

static tool_cu g_cu;
static tool_lt g_lt;
static int g_cu_state; /* 0 not tried, 1 loaded, <0 the failure */
static int g_lt_state;
static char g_cu_err[512];
static char g_lt_err[1024];

static int sym(void *lib, const char *name, void *slot)
{
    void *p = dlsym(lib, name);
    if (p == NULL)
        return -1;
    memcpy(slot, &p, sizeof(p));
    return 0;
}

static int load_cu(void)
{
    if (g_cu_state != 0)
        return g_cu_state > 0 ? 0 : g_cu_state;
    static const struct {
        const char *name;
        size_t offset;
    } names[] = {
        { "cuGetErrorName", offsetof(tool_cu, GetErrorName) },
        { "cuCtxGetCurrent", offsetof(tool_cu, CtxGetCurrent) },
        { "cuCtxSetCurrent", offsetof(tool_cu, CtxSetCurrent) },
        { "cuMemAlloc", offsetof(tool_cu, MemAlloc) },
        { "cuMemFree", offsetof(tool_cu, MemFree) },
        { "cuMemcpyHtoD", offsetof(tool_cu, MemcpyHtoD) },
        { "cuMemcpyHtoDAsync", offsetof(tool_cu, MemcpyHtoDAsync) },
        { "cuMemcpyDtoHAsync", offsetof(tool_cu, MemcpyDtoHAsync) },
        { "cuMemHostAlloc", offsetof(tool_cu, MemHostAlloc) },
        { "cuMemFreeHost", offsetof(tool_cu, MemFreeHost) },
        { "cuStreamSynchronize", offsetof(tool_cu, StreamSynchronize) },
        { "cuLaunchHostFunc", offsetof(tool_cu, LaunchHostFunc) },
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        void *fn = NULL;
        /* The driver the library's cuda device opened: the tool gives it no path, so
         * libcuda.so.1 (DDO_VMM_LIBRARY_PATH is not a driver path: the variable names
         * ddo's own native library, which the Python bootstrap resolves). */
        int rc = ddo__cuda_driver_proc(NULL, names[i].name, TOOL_CU_ABI, &fn);
        if (rc != 0) {
            snprintf(g_cu_err, sizeof(g_cu_err), "%s", ddo_last_error());
            memset(&g_cu, 0, sizeof(g_cu));
            return g_cu_state = rc;
        }
        memcpy((char *)&g_cu + names[i].offset, &fn, sizeof(fn));
    }
    g_cu_state = 1;
    return 0;
}

#    if defined(_WIN32)
#        define DDO_LT_WHERE "ddo.exe's folder, System32 and CUDA_PATH"
#    else
#        define DDO_LT_WHERE "the loader's path: LD_LIBRARY_PATH, ld.so.cache"
#    endif

/* dlopen(name), or NULL with why appended to tried. */
static void *try_lt(const char *name, char *tried, size_t len)
{
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *e = dlerror();
        size_t n = strlen(tried);
        if (n < len)
            snprintf(tried + n, len - n, "%s%s", n ? "; " : "", e != NULL ? e : name);
    }
    return lib;
}

static int load_lt(void)
{
    if (g_lt_state != 0)
        return g_lt_state > 0 ? 0 : g_lt_state;
#    if defined(_WIN32)
    static const char *const libs[] = { "cublasLt64_13.dll", "cublasLt64_12.dll" };
#    else
    static const char *const libs[] = { "libcublasLt.so.13", "libcublasLt.so.12",
                                        "libcublasLt.so" };
#    endif
    void *lib = NULL;
    char tried[700] = "";
    for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]) && lib == NULL; i++)
        lib = try_lt(libs[i], tried, sizeof(tried));
#    if defined(_WIN32)
    /* The default DLL directories are ddo.exe's folder and System32; the CUDA toolkit's
     * installer names its folder in CUDA_PATH (its DLLs in bin, from CUDA 13 in bin\x64). */
    const char *cuda = getenv("CUDA_PATH");
    static const char *const sub[] = { "bin\\x64", "bin" };
    for (size_t j = 0; cuda != NULL && cuda[0] != '\0' && j < 2 && lib == NULL; j++)
        for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]) && lib == NULL; i++) {
            char path[600];
            snprintf(path, sizeof(path), "%s\\%s\\%s", cuda, sub[j], libs[i]);
            lib = try_lt(path, tried, sizeof(tried));
        }
#    endif
    if (lib == NULL) {
        snprintf(g_lt_err, sizeof(g_lt_err),
                 "no cuBLASLt (the reference host's products on cuda: the CUDA toolkit's, "
                 "found through %s): %s",
                 DDO_LT_WHERE, tried);
        return g_lt_state = DDO_E_NO_DEVICE;
    }
    static const struct {
        const char *name;
        size_t offset;
    } names[] = {
        { "cublasLtCreate", offsetof(tool_lt, Create) },
        { "cublasLtDestroy", offsetof(tool_lt, Destroy) },
        { "cublasLtGetStatusName", offsetof(tool_lt, GetStatusName) },
        { "cublasLtGetVersion", offsetof(tool_lt, GetVersion) },
        { "cublasLtMatmulDescCreate", offsetof(tool_lt, MatmulDescCreate) },
        { "cublasLtMatmulDescDestroy", offsetof(tool_lt, MatmulDescDestroy) },
        { "cublasLtMatmulDescSetAttribute", offsetof(tool_lt, MatmulDescSetAttribute) },
        { "cublasLtMatrixLayoutCreate", offsetof(tool_lt, MatrixLayoutCreate) },
        { "cublasLtMatrixLayoutDestroy", offsetof(tool_lt, MatrixLayoutDestroy) },
        { "cublasLtMatmulPreferenceCreate", offsetof(tool_lt, MatmulPreferenceCreate) },
        { "cublasLtMatmulPreferenceDestroy", offsetof(tool_lt, MatmulPreferenceDestroy) },
        { "cublasLtMatmulPreferenceSetAttribute", offsetof(tool_lt, MatmulPreferenceSetAttribute) },
        { "cublasLtMatmulAlgoGetHeuristic", offsetof(tool_lt, MatmulAlgoGetHeuristic) },
        { "cublasLtMatmul", offsetof(tool_lt, Matmul) },
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (sym(lib, names[i].name, (char *)&g_lt + names[i].offset) != 0) {
            snprintf(g_lt_err, sizeof(g_lt_err), "no cuBLASLt: no symbol %s", names[i].name);
            memset(&g_lt, 0, sizeof(g_lt));
            return g_lt_state = DDO_E_NO_DEVICE;
        }
    }
    g_lt_state = 1;
    return 0;
}

static const char *cu_err_name(CUresult r)
{
    const char *s = NULL;
    if (g_cu.GetErrorName != NULL && g_cu.GetErrorName(r, &s) == CUDA_SUCCESS && s != NULL)
        return s;
    return "CUDA_ERROR_UNKNOWN";
}

static const char *lt_err_name(cublasStatus_t st)
{
    const char *s = g_lt.GetStatusName != NULL ? g_lt.GetStatusName(st) : NULL;
    return s != NULL ? s : "CUBLAS_STATUS_UNKNOWN";
}

static int cu_fail(char *err, size_t err_len, CUresult r, const char *call, const char *what)
{
    return tool_fail(err, err_len,
                     r == CUDA_ERROR_OUT_OF_MEMORY ? DDO_E_DEVICE_MEMORY : DDO_E_DEVICE,
                     "reference host: %s: %s%s%s", call, cu_err_name(r), what[0] ? " " : "", what);
}

static int lt_fail(char *err, size_t err_len, cublasStatus_t st, const char *call, const char *what)
{
    return tool_fail(err, err_len,
                     st == CUBLAS_STATUS_ALLOC_FAILED ? DDO_E_DEVICE_MEMORY : DDO_E_DEVICE,
                     "reference host: %s: %s%s%s", call, lt_err_name(st), what[0] ? " " : "", what);
}

/* ---- the back end ---- */

typedef struct shape {
    ddo_dtype dtype;
    uint64_t out, in;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
    size_t act; /* index into acts */
} shape;

typedef struct act {
    ddo_dtype dtype;
    uint64_t in;
    CUdeviceptr x;
} act;

struct ref_host_cuda {
    const ddo_checkpoint *ck;
    ref_host_config cfg;
    CUcontext ctx;
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    shape *shapes;
    size_t nshapes;
    act *acts;
    size_t nacts;
    int32_t *tensor_shape; /* per checkpoint tensor: index into shapes, -1 = moved only */
    CUdeviceptr out;
    CUdeviceptr ws;
    size_t rows;    /* sampled rows per weight (checksum mode) */
    float *samples; /* pinned, checksum mode */
    size_t samples_cap, samples_len;
    size_t *pending; /* per run weight: floats sampled */
    size_t pending_cap, pending_len;
    uint64_t step; /* the step fold so far */
};

static cudaDataType cuda_type(ddo_dtype t)
{
    return t == DDO_DTYPE_BF16 ? CUDA_R_16BF : t == DDO_DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static bool computable(const ddo_tensor_info *ti)
{
    return ti->ndim == 2 && ti->shape[0] > 0 && ti->shape[1] > 0 &&
           (ti->dtype == DDO_DTYPE_BF16 || ti->dtype == DDO_DTYPE_F16 ||
            ti->dtype == DDO_DTYPE_F32);
}

/* Output dtype of a weight's product. */
static ddo_dtype out_dtype(const ref_host_cuda *c, ddo_dtype in)
{
    return c->cfg.checksum ? DDO_DTYPE_F32 : in;
}

static int bind(const ref_host_cuda *c, char *err, size_t err_len)
{
    CUcontext cur = NULL;
    if (g_cu.CtxGetCurrent(&cur) == CUDA_SUCCESS && cur == c->ctx)
        return 0;
    CUresult r = g_cu.CtxSetCurrent(c->ctx);
    if (r != CUDA_SUCCESS)
        return cu_fail(err, err_len, r, "cuCtxSetCurrent", "(the device's primary context)");
    return 0;
}

/* Fills a host buffer with the activation of in-dimension `in` in dtype t. */
static void fill_activation(void *buf, ddo_dtype t, uint64_t tokens, uint64_t in)
{
    uint64_t n = tokens * in;
    for (uint64_t i = 0; i < n; i++) {
        float v = ref_activation(in, i);
        uint32_t bits;
        memcpy(&bits, &v, sizeof(bits));
        if (t == DDO_DTYPE_F32) {
            ((float *)buf)[i] = v;
        } else if (t == DDO_DTYPE_BF16) {
            ((uint16_t *)buf)[i] = (uint16_t)(bits >> 16); /* exact: k/256 has 8 bits */
        } else {
            /* F16 of k/256, |k| <= 256: normal or zero, exact. */
            uint16_t h = (uint16_t)((bits >> 16) & 0x8000u);
            uint32_t e = (bits >> 23) & 0xffu;
            if (e != 0)
                h = (uint16_t)(h | ((e - 127u + 15u) << 10) | ((bits & 0x7fffffu) >> 13));
            ((uint16_t *)buf)[i] = h;
        }
    }
}

static int find_act(ref_host_cuda *c, ddo_dtype t, uint64_t in, size_t *idx)
{
    for (size_t i = 0; i < c->nacts; i++)
        if (c->acts[i].dtype == t && c->acts[i].in == in) {
            *idx = i;
            return 0;
        }
    act *p = realloc(c->acts, (c->nacts + 1) * sizeof(*p));
    if (p == NULL)
        return DDO_E_NO_MEMORY;
    c->acts = p;
    c->acts[c->nacts] = (act){ t, in, 0 };
    *idx = c->nacts++;
    return 0;
}

static int find_shape(ref_host_cuda *c, const ddo_tensor_info *ti, size_t *idx)
{
    for (size_t i = 0; i < c->nshapes; i++)
        if (c->shapes[i].dtype == ti->dtype && c->shapes[i].out == ti->shape[0] &&
            c->shapes[i].in == ti->shape[1]) {
            *idx = i;
            return 0;
        }
    shape *p = realloc(c->shapes, (c->nshapes + 1) * sizeof(*p));
    if (p == NULL)
        return DDO_E_NO_MEMORY;
    c->shapes = p;
    shape *s = &c->shapes[c->nshapes];
    memset(s, 0, sizeof(*s));
    s->dtype = ti->dtype;
    s->out = ti->shape[0];
    s->in = ti->shape[1];
    int rc = find_act(c, ti->dtype, s->in, &s->act);
    if (rc != 0)
        return rc;
    *idx = c->nshapes++;
    return 0;
}

/* Layouts and the heuristic's first algorithm for one shape (column-major view:
 * D [out, tokens] = op(A)=W [out, in] (A stored [in, out], transposed) x B=X^T [in, tokens]). */
static int prepare_shape(ref_host_cuda *c, shape *s, cublasLtMatmulPreference_t pref, char *err,
                         size_t err_len)
{
    char what[160];
    snprintf(what, sizeof(what), "for %s [%llu, %llu] x %llu tokens", ddo_dtype_name(s->dtype),
             (unsigned long long)s->out, (unsigned long long)s->in,
             (unsigned long long)c->cfg.tokens);
    cudaDataType t = cuda_type(s->dtype);
    cublasStatus_t st = g_lt.MatrixLayoutCreate(&s->a, t, s->in, s->out, (int64_t)s->in);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = g_lt.MatrixLayoutCreate(&s->b, t, s->in, c->cfg.tokens, (int64_t)s->in);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = g_lt.MatrixLayoutCreate(&s->d, cuda_type(out_dtype(c, s->dtype)), s->out,
                                     c->cfg.tokens, (int64_t)s->out);
    if (st != CUBLAS_STATUS_SUCCESS)
        return lt_fail(err, err_len, st, "cublasLtMatrixLayoutCreate", what);
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof(res));
    int found = 0;
    st = g_lt.MatmulAlgoGetHeuristic(c->lt, c->desc, s->a, s->b, s->d, s->d, pref, 1, &res, &found);
    if (st != CUBLAS_STATUS_SUCCESS)
        return lt_fail(err, err_len, st, "cublasLtMatmulAlgoGetHeuristic", what);
    if (found < 1)
        return tool_fail(err, err_len, DDO_E_UNSUPPORTED,
                         "reference host: cuBLASLt has no algorithm %s", what);
    s->algo = res.algo;
    return 0;
}

/* Queues one product on stream. */
static int matmul(ref_host_cuda *c, const shape *s, CUdeviceptr w, CUstream stream, char *err,
                  size_t err_len)
{
    const float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t st =
        g_lt.Matmul(c->lt, c->desc, &alpha, (const void *)(uintptr_t)w, s->a,
                    (const void *)(uintptr_t)c->acts[s->act].x, s->b, &beta,
                    (const void *)(uintptr_t)c->out, s->d, (void *)(uintptr_t)c->out, s->d,
                    &s->algo, (void *)(uintptr_t)c->ws, WORKSPACE_BYTES, stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
        char what[128];
        snprintf(what, sizeof(what), "for %s [%llu, %llu]", ddo_dtype_name(s->dtype),
                 (unsigned long long)s->out, (unsigned long long)s->in);
        return lt_fail(err, err_len, st, "cublasLtMatmul", what);
    }
    return 0;
}

int ref_host_cuda_available(void)
{
    int rc = load_cu();
    return rc != 0 ? rc : load_lt();
}

void ref_host_cuda_destroy(ref_host_cuda *c)
{
    if (c == NULL)
        return;
    if (g_cu_state > 0 && c->ctx != NULL && bind(c, NULL, 0) == 0) {
        if (c->samples != NULL)
            g_cu.MemFreeHost(c->samples);
        for (size_t i = 0; i < c->nacts; i++)
            if (c->acts[i].x != 0)
                g_cu.MemFree(c->acts[i].x);
        if (c->out != 0)
            g_cu.MemFree(c->out);
        if (c->ws != 0)
            g_cu.MemFree(c->ws);
    }
    if (g_lt_state > 0) {
        for (size_t i = 0; i < c->nshapes; i++) {
            if (c->shapes[i].a != NULL)
                g_lt.MatrixLayoutDestroy(c->shapes[i].a);
            if (c->shapes[i].b != NULL)
                g_lt.MatrixLayoutDestroy(c->shapes[i].b);
            if (c->shapes[i].d != NULL)
                g_lt.MatrixLayoutDestroy(c->shapes[i].d);
        }
        if (c->desc != NULL)
            g_lt.MatmulDescDestroy(c->desc);
        if (c->lt != NULL)
            g_lt.Destroy(c->lt);
    }
    free(c->shapes);
    free(c->acts);
    free(c->tensor_shape);
    free(c->pending);
    free(c);
}

/* The shapes of the computable tensors; the largest output rows and weight, the rows in all. */
static int scan_shapes(ref_host_cuda *c, uint64_t *max_out, uint64_t *max_weight_bytes,
                       uint64_t *sum_out, char *err, size_t err_len)
{
    size_t n = ddo_checkpoint_tensor_count(c->ck);
    c->tensor_shape = malloc((n ? n : 1) * sizeof(int32_t));
    if (c->tensor_shape == NULL)
        return tool_fail(err, err_len, DDO_E_NO_MEMORY, "reference host: out of host memory");
    *max_out = *max_weight_bytes = *sum_out = 0;
    for (size_t i = 0; i < n; i++) {
        const ddo_tensor_info *ti = ddo_checkpoint_tensor(c->ck, i);
        c->tensor_shape[i] = -1;
        if (ti == NULL || !computable(ti))
            continue;
        size_t si = 0;
        int rc = find_shape(c, ti, &si);
        if (rc != 0)
            return tool_fail(err, err_len, rc, "reference host: out of host memory");
        c->tensor_shape[i] = (int32_t)si;
        if (ti->shape[0] > *max_out)
            *max_out = ti->shape[0];
        if (ti->nbytes > *max_weight_bytes)
            *max_weight_bytes = ti->nbytes;
        *sum_out += ti->shape[0];
    }
    return 0;
}

/* cuBLASLt: the handle, the matmul descriptor and one prepared algorithm per shape. */
static int lt_setup(ref_host_cuda *c, char *err, size_t err_len)
{
    cublasLtMatmulPreference_t pref = NULL;
    cublasStatus_t st = g_lt.Create(&c->lt);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = g_lt.MatmulDescCreate(&c->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st != CUBLAS_STATUS_SUCCESS)
        return lt_fail(err, err_len, st, "cublasLtCreate", "");
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    st = g_lt.MatmulDescSetAttribute(c->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    if (st == CUBLAS_STATUS_SUCCESS)
        st = g_lt.MatmulDescSetAttribute(c->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    if (st == CUBLAS_STATUS_SUCCESS)
        st = g_lt.MatmulPreferenceCreate(&pref);
    size_t ws = WORKSPACE_BYTES;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = g_lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                               sizeof(ws));
    /* Every reduction scheme is allowed: cuBLASLt's split-K reductions (in place ones too,
     * which order their parts with counters) are deterministic for a fixed algorithm, and
     * the algorithm is fixed per shape below. */
    int rc = 0;
    if (st != CUBLAS_STATUS_SUCCESS)
        rc = lt_fail(err, err_len, st, "cublasLtMatmulDesc/Preference", "");
    for (size_t i = 0; rc == 0 && i < c->nshapes; i++)
        rc = prepare_shape(c, &c->shapes[i], pref, err, err_len);
    if (pref != NULL)
        g_lt.MatmulPreferenceDestroy(pref);
    return rc;
}

/* Device buffers: workspace, one output buffer (products run in order on one stream), one
 * activation per (dtype, in), and the pinned checksum samples. */
static int alloc_buffers(ref_host_cuda *c, uint64_t max_out, uint64_t sum_out, char *err,
                         size_t err_len)
{
    const ref_host_config *cfg = &c->cfg;
    CUresult r = g_cu.MemAlloc(&c->ws, WORKSPACE_BYTES);
    if (r != CUDA_SUCCESS)
        return cu_fail(err, err_len, r, "cuMemAlloc", "(cuBLASLt workspace)");
    if (c->nshapes > 0) {
        size_t out_bytes = (size_t)(max_out * cfg->tokens * 4);
        r = g_cu.MemAlloc(&c->out, out_bytes);
        if (r != CUDA_SUCCESS)
            return cu_fail(err, err_len, r, "cuMemAlloc", "(reference host outputs)");
    }
    for (size_t i = 0; i < c->nacts; i++) {
        size_t bytes = (size_t)(cfg->tokens * c->acts[i].in * ddo_dtype_size(c->acts[i].dtype));
        void *hostbuf = malloc(bytes);
        if (hostbuf == NULL)
            return tool_fail(err, err_len, DDO_E_NO_MEMORY, "reference host: out of host memory");
        fill_activation(hostbuf, c->acts[i].dtype, cfg->tokens, c->acts[i].in);
        r = g_cu.MemAlloc(&c->acts[i].x, bytes);
        if (r == CUDA_SUCCESS)
            r = g_cu.MemcpyHtoD(c->acts[i].x, hostbuf, bytes);
        free(hostbuf);
        if (r != CUDA_SUCCESS)
            return cu_fail(err, err_len, r, "cuMemAlloc/cuMemcpyHtoD", "(activations)");
    }
    if (cfg->checksum && c->nshapes > 0) {
        c->rows = cfg->tokens < SAMPLE_ROWS ? (size_t)cfg->tokens : SAMPLE_ROWS;
        c->samples_cap = (size_t)(sum_out * c->rows);
        r = g_cu.MemHostAlloc((void **)&c->samples, c->samples_cap * sizeof(float), 0);
        if (r != CUDA_SUCCESS)
            return cu_fail(err, err_len, r, "cuMemHostAlloc", "(checksum samples)");
    }
    return 0;
}

/* Warm-up: one product per shape on a scratch weight, so cuBLASLt loads its kernels now and
 * not inside the first timed step (or the device-memory measurement). */
static int warm_up(ref_host_cuda *c, uint64_t max_weight_bytes, char *err, size_t err_len)
{
    if (c->nshapes == 0)
        return 0;
    CUdeviceptr scratch = 0;
    CUresult r = g_cu.MemAlloc(&scratch, (size_t)max_weight_bytes);
    if (r != CUDA_SUCCESS)
        return cu_fail(err, err_len, r, "cuMemAlloc", "(warm-up weight)");
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < c->nshapes; i++)
        rc = matmul(c, &c->shapes[i], scratch, NULL, err, err_len);
    if (rc == 0) {
        r = g_cu.StreamSynchronize(NULL);
        if (r != CUDA_SUCCESS)
            rc = cu_fail(err, err_len, r, "cuStreamSynchronize", "(warm-up)");
    }
    g_cu.MemFree(scratch);
    return rc;
}

int ref_host_cuda_create(ddo_device *dev, const ddo_checkpoint *ck, const ref_host_config *cfg,
                         ref_host_cuda **out, char *err, size_t err_len)
{
    if (dev == NULL || ck == NULL || cfg == NULL || out == NULL || cfg->tokens == 0)
        return tool_fail(err, err_len, DDO_E_INVALID_ARGUMENT, "reference host: invalid argument");
    if (load_cu() != 0)
        return tool_fail(err, err_len, DDO_E_NO_DEVICE, "reference host: %s", g_cu_err);
    if (load_lt() != 0)
        return tool_fail(err, err_len, DDO_E_NO_DEVICE, "reference host: %s", g_lt_err);
    /* A call into the device makes its primary context current on this thread. */
    ddo_device_caps caps;
    int rc = ddo_device_caps_get(dev, &caps);
    if (rc != 0)
        return tool_fail(err, err_len, rc, "reference host: %s", ddo_device_error(dev));
    ref_host_cuda *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return tool_fail(err, err_len, DDO_E_NO_MEMORY, "reference host: out of host memory");
    c->ck = ck;
    c->cfg = *cfg;
    c->step = REF_CHECKSUM_INIT;
    CUresult r = g_cu.CtxGetCurrent(&c->ctx);
    if (r != CUDA_SUCCESS || c->ctx == NULL) {
        rc = tool_fail(err, err_len, DDO_E_DEVICE,
                       "reference host: no current CUDA context after opening %s", caps.name);
        goto fail;
    }
    uint64_t max_out = 0, max_weight_bytes = 0, sum_out = 0;
    if ((rc = scan_shapes(c, &max_out, &max_weight_bytes, &sum_out, err, err_len)) != 0 ||
        (rc = lt_setup(c, err, err_len)) != 0 ||
        (rc = alloc_buffers(c, max_out, sum_out, err, err_len)) != 0 ||
        (rc = warm_up(c, max_weight_bytes, err, err_len)) != 0)
        goto fail;
    *out = c;
    return 0;
fail:
    ref_host_cuda_destroy(c);
    return rc;
}

/* Folds the sampled rows that have arrived (the stream is synchronized). */
static void fold_pending(ref_host_cuda *c)
{
    size_t off = 0;
    for (size_t i = 0; i < c->pending_len; i++) {
        uint64_t h = ref_checksum_floats(REF_CHECKSUM_INIT, c->samples + off, c->pending[i]);
        c->step = ref_checksum_u64(c->step, h);
        off += c->pending[i];
    }
    c->pending_len = 0;
    c->samples_len = 0;
}

/* Queues the copies of the sampled rows of the product just queued. */
static int sample_rows(ref_host_cuda *c, const shape *s, CUstream stream, char *err, size_t err_len)
{
    size_t need = (size_t)s->out * c->rows;
    if (c->samples_len + need > c->samples_cap) {
        CUresult r = g_cu.StreamSynchronize(stream);
        if (r != CUDA_SUCCESS)
            return cu_fail(err, err_len, r, "cuStreamSynchronize", "(checksum samples)");
        fold_pending(c);
    }
    if (c->pending_len == c->pending_cap) {
        size_t cap = c->pending_cap ? 2 * c->pending_cap : 256;
        size_t *p = realloc(c->pending, cap * sizeof(*p));
        if (p == NULL)
            return tool_fail(err, err_len, DDO_E_NO_MEMORY, "reference host: out of host memory");
        c->pending = p;
        c->pending_cap = cap;
    }
    for (size_t k = 0; k < c->rows; k++) {
        uint64_t row = c->rows > 1 ? k * (c->cfg.tokens - 1) / (c->rows - 1) : 0;
        CUresult r = g_cu.MemcpyDtoHAsync(c->samples + c->samples_len + k * s->out,
                                          c->out + row * s->out * sizeof(float),
                                          (size_t)s->out * sizeof(float), stream);
        if (r != CUDA_SUCCESS)
            return cu_fail(err, err_len, r, "cuMemcpyDtoHAsync", "(checksum samples)");
    }
    c->samples_len += need;
    c->pending[c->pending_len++] = need;
    return 0;
}

int ref_host_cuda_run_tensors(ref_host_cuda *c, ddo_session *s, const size_t *tensors, size_t count,
                              ddo_stream *stream, ref_host_stats *stats, char *err, size_t err_len)
{
    if (c == NULL || s == NULL || (tensors == NULL && count > 0) || stream == NULL)
        return tool_fail(err, err_len, DDO_E_INVALID_ARGUMENT, "reference host: invalid argument");
    int rc = bind(c, err, err_len);
    if (rc != 0)
        return rc;
    CUstream cs = (CUstream)ddo_stream_native(stream);
    size_t n = ddo_checkpoint_tensor_count(c->ck);
    for (size_t i = 0; i < count; i++) {
        size_t t = tensors[i];
        if (t >= n || c->tensor_shape[t] < 0) {
            if (stats != NULL)
                stats->weights_skipped++;
            continue;
        }
        const shape *sh = &c->shapes[c->tensor_shape[t]];
        void *w = NULL;
        rc = ddo_session_tensor_address(s, t, &w);
        if (rc != 0) {
            const ddo_tensor_info *ti = ddo_checkpoint_tensor(c->ck, t);
            return tool_fail(err, err_len, rc,
                             "reference host: tensor \"%s\": no device address: %s",
                             ti != NULL ? ti->name : "?", ddo_session_error(s));
        }
        rc = matmul(c, sh, (CUdeviceptr)(uintptr_t)w, cs, err, err_len);
        if (rc == 0 && c->cfg.checksum)
            rc = sample_rows(c, sh, cs, err, err_len);
        if (rc != 0)
            return rc;
        if (stats != NULL) {
            stats->weights_computed++;
            stats->flops += 2 * c->cfg.tokens * sh->out * sh->in;
        }
    }
    return 0;
}

int ref_host_cuda_step_checksum(ref_host_cuda *c, ddo_stream *stream, uint64_t *checksum, char *err,
                                size_t err_len)
{
    if (c == NULL || checksum == NULL)
        return tool_fail(err, err_len, DDO_E_INVALID_ARGUMENT, "reference host: invalid argument");
    if (stream != NULL) {
        int rc = ddo_stream_synchronize(stream);
        if (rc != 0)
            return tool_fail(err, err_len, rc, "reference host: stream: %s", ddo_last_error());
    }
    uint64_t v = 0;
    if (c->cfg.checksum) {
        fold_pending(c);
        v = c->step;
        c->step = REF_CHECKSUM_INIT;
    }
    *checksum = v;
    return 0;
}

int ref_host_cuda_bus_bandwidth(ddo_stream *stream, uint64_t total_bytes, size_t piece_bytes,
                                double *bytes_per_s, char *err, size_t err_len)
{
    if (stream == NULL || piece_bytes == 0 || total_bytes < piece_bytes || bytes_per_s == NULL)
        return tool_fail(err, err_len, DDO_E_INVALID_ARGUMENT, "bus bandwidth: invalid argument");
    if (load_cu() != 0)
        return tool_fail(err, err_len, DDO_E_NO_DEVICE, "bus bandwidth: %s", g_cu_err);
    /* Synchronizing the stream makes the device's context current on this thread. */
    int rc = ddo_stream_synchronize(stream);
    if (rc != 0)
        return tool_fail(err, err_len, rc, "bus bandwidth: %s", ddo_last_error());
    CUstream cs = (CUstream)ddo_stream_native(stream);
    size_t span = 16 * piece_bytes; /* a 256 MiB window for 16 MiB pieces, reused */
    void *host = NULL;
    CUdeviceptr dev = 0;
    CUresult r = g_cu.MemHostAlloc(&host, span, 0);
    if (r != CUDA_SUCCESS)
        return cu_fail(err, err_len, r, "cuMemHostAlloc", "(bus bandwidth buffer)");
    memset(host, 0x5a, span);
    r = g_cu.MemAlloc(&dev, span);
    if (r != CUDA_SUCCESS) {
        g_cu.MemFreeHost(host);
        return cu_fail(err, err_len, r, "cuMemAlloc", "(bus bandwidth buffer)");
    }
    double best = 0;
    for (int round = 0; round < 3 && r == CUDA_SUCCESS; round++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (uint64_t off = 0; off + piece_bytes <= total_bytes && r == CUDA_SUCCESS;
             off += piece_bytes) {
            size_t o = (size_t)(off % span);
            r = g_cu.MemcpyHtoDAsync(dev + o, (char *)host + o, piece_bytes, cs);
        }
        if (r == CUDA_SUCCESS)
            r = g_cu.StreamSynchronize(cs);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        double moved = (double)(total_bytes / piece_bytes * piece_bytes);
        if (round > 0 && s > 0 && moved / s > best) /* round 0 warms up */
            best = moved / s;
    }
    g_cu.MemFree(dev);
    g_cu.MemFreeHost(host);
    if (r != CUDA_SUCCESS)
        return cu_fail(err, err_len, r, "cuMemcpyHtoDAsync", "(bus bandwidth)");
    *bytes_per_s = best;
    return 0;
}

int ref_host_cuda_stream_callback(ddo_stream *stream, void (*fn)(void *), void *user, char *err,
                                  size_t err_len)
{
    if (load_cu() != 0)
        return tool_fail(err, err_len, DDO_E_NO_DEVICE, "%s", g_cu_err);
    CUresult r = g_cu.LaunchHostFunc((CUstream)ddo_stream_native(stream), fn, user);
    if (r != CUDA_SUCCESS)
        return cu_fail(err, err_len, r, "cuLaunchHostFunc", "(trace)");
    return 0;
}

#else /* !DDO_HAVE_CUDA_H */

int ref_host_cuda_available(void)
{
    return DDO_E_NO_DEVICE;
}

int ref_host_cuda_create(ddo_device *dev, const ddo_checkpoint *ck, const ref_host_config *cfg,
                         ref_host_cuda **out, char *err, size_t err_len)
{
    (void)dev;
    (void)ck;
    (void)cfg;
    (void)out;
    return tool_fail(err, err_len, DDO_E_NO_DEVICE,
                     "reference host: built without CUDA headers: no cuda back end");
}

void ref_host_cuda_destroy(ref_host_cuda *c)
{
    (void)c;
}

int ref_host_cuda_run_tensors(ref_host_cuda *c, ddo_session *s, const size_t *tensors, size_t count,
                              ddo_stream *stream, ref_host_stats *stats, char *err, size_t err_len)
{
    (void)c;
    (void)s;
    (void)tensors;
    (void)count;
    (void)stream;
    (void)stats;
    return tool_fail(err, err_len, DDO_E_NO_DEVICE, "reference host: built without CUDA headers");
}

int ref_host_cuda_step_checksum(ref_host_cuda *c, ddo_stream *stream, uint64_t *checksum, char *err,
                                size_t err_len)
{
    (void)c;
    (void)stream;
    (void)checksum;
    return tool_fail(err, err_len, DDO_E_NO_DEVICE, "reference host: built without CUDA headers");
}

int ref_host_cuda_bus_bandwidth(ddo_stream *stream, uint64_t total_bytes, size_t piece_bytes,
                                double *bytes_per_s, char *err, size_t err_len)
{
    (void)stream;
    (void)total_bytes;
    (void)piece_bytes;
    (void)bytes_per_s;
    return tool_fail(err, err_len, DDO_E_NO_DEVICE, "bus bandwidth: built without CUDA headers");
}

int ref_host_cuda_stream_callback(ddo_stream *stream, void (*fn)(void *), void *user, char *err,
                                  size_t err_len)
{
    (void)stream;
    (void)fn;
    (void)user;
    return tool_fail(err, err_len, DDO_E_NO_DEVICE, "built without CUDA headers");
}

#endif
