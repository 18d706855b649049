/*
 * collective.c - the all-gather of a device set and the split upload (collective.h): the
 * cpu device's emulation (host functions meeting at barriers) and NCCL loaded at run time.
 */
#include "device/collective.h"

#include "os/dl.h"
#include "os/sys.h"

#include "os/thread.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NCCL_DEFAULT_LIBRARY "libnccl.so.2"
#define NCCL_UINT8           1 /* ncclUint8 */

/* ---- NCCL, loaded once per process and kept loaded (as the CUDA driver) ---- */

typedef int (*nccl_version_fn)(int *version);
typedef int (*nccl_init_all_fn)(void **comms, int ndev, const int *devlist);
typedef int (*nccl_destroy_fn)(void *comm);
typedef int (*nccl_all_gather_fn)(const void *send, void *recv, size_t count, int datatype,
                                  void *comm, void *stream);
typedef int (*nccl_group_fn)(void);
typedef const char *(*nccl_error_fn)(int result);

typedef struct nccl_api {
    void *lib;
    int version;
    nccl_version_fn GetVersion;
    nccl_init_all_fn CommInitAll;
    nccl_destroy_fn CommDestroy;
    nccl_all_gather_fn AllGather;
    nccl_group_fn GroupStart, GroupEnd;
    nccl_error_fn GetErrorString;
} nccl_api;

static ddo__mutex nccl_lock = DDO__MUTEX_INITIALIZER;
static nccl_api nccl;

/* Resolves every entry point of lib into a; false (a left unchanged) when one is missing. */
static bool nccl_symbols(void *lib, nccl_api *a, const char **missing)
{
    static const char *const names[] = { "ncclGetVersion",    "ncclCommInitAll", "ncclCommDestroy",
                                         "ncclAllGather",     "ncclGroupStart",  "ncclGroupEnd",
                                         "ncclGetErrorString" };
    void *fn[DDO_ARRAY_LEN(names)];
    for (size_t i = 0; i < DDO_ARRAY_LEN(names); i++) {
        fn[i] = ddo__os_lib_sym(lib, names[i]);
        if (fn[i] == NULL) {
            *missing = names[i];
            return false;
        }
    }
    memcpy(&a->GetVersion, &fn[0], sizeof(void *));
    memcpy(&a->CommInitAll, &fn[1], sizeof(void *));
    memcpy(&a->CommDestroy, &fn[2], sizeof(void *));
    memcpy(&a->AllGather, &fn[3], sizeof(void *));
    memcpy(&a->GroupStart, &fn[4], sizeof(void *));
    memcpy(&a->GroupEnd, &fn[5], sizeof(void *));
    memcpy(&a->GetErrorString, &fn[6], sizeof(void *));
    a->lib = lib;
    return true;
}

/* Never NVLink multicast: NCCL_NVLS_ENABLE=0 when unset; any other value is refused. */
static int nvls_off(ddo__errbuf *eb)
{
#if defined(_WIN32)
    (void)eb;
    return 0;
#else
    const char *v = getenv("NCCL_NVLS_ENABLE");
    if (v == NULL)
        return setenv("NCCL_NVLS_ENABLE", "0", 0) == 0
                   ? 0
                   : ddo__fail(eb, DDO_E_NO_MEMORY, "NCCL: setting NCCL_NVLS_ENABLE=0");
    if (strcmp(v, "0") != 0)
        return ddo__fail(eb, DDO_E_CONFIG,
                         "NCCL_NVLS_ENABLE=%s: ddo never uses NCCL's NVLink multicast path; "
                         "set NCCL_NVLS_ENABLE=0",
                         v);
    return 0;
#endif
}

/* Loads NCCL (path, else libnccl.so.2) once; DDO_E_NO_DEVICE with one line when it cannot. */
static int nccl_load(const char *path, ddo__errbuf *eb)
{
    if (path == NULL || path[0] == '\0')
        path = NCCL_DEFAULT_LIBRARY;
    ddo__mutex_lock(&nccl_lock);
    int rc = 0;
    if (nccl.lib == NULL) {
        char err[256] = "";
        const char *missing = NULL;
        void *lib = ddo__os_lib_open(path, err, sizeof(err));
        nccl_api a;
        memset(&a, 0, sizeof(a));
        if (lib == NULL) {
            rc = ddo__fail(eb, DDO_E_NO_DEVICE, "NCCL not available: dlopen(%s): %s", path, err);
        } else if (!nccl_symbols(lib, &a, &missing)) {
            ddo__os_lib_close(lib);
            rc = ddo__fail(eb, DDO_E_NO_DEVICE, "NCCL not available: %s has no %s", path, missing);
        } else {
            if (a.GetVersion(&a.version) != 0)
                a.version = 0;
            nccl = a;
        }
    }
    ddo__mutex_unlock(&nccl_lock);
    return rc;
}

/* ---- the communicator ---- */

struct ddo__comm {
    size_t n;
    ddo_device *devs[DDO__COMM_MAX];
    bool nccl;
    void *comms[DDO__COMM_MAX];
    char engine[48];
};

/* One emulated all-gather in flight: the ranks' host functions meet twice. */
typedef struct gather_op gather_op;
typedef struct gather_rank {
    gather_op *op;
    size_t rank;
} gather_rank;
struct gather_op {
    size_t n, expected; /* ranks; host functions queued (n unless queueing failed) */
    uint64_t send[DDO__COMM_MAX], recv[DDO__COMM_MAX], bytes;
    gather_rank ranks[DDO__COMM_MAX];
    ddo__mutex mu;
    ddo__cond cv;
    size_t arrived, copied, left;
    bool failed;
};

static void wait_for(gather_op *op, const size_t *count)
{
    while (*count < op->expected && !op->failed)
        ddo__cond_wait(&op->cv, &op->mu);
}

/* A rank's host function: every rank arrived (their shards are in place), copy the others'
 * shards, and wait until every rank copied (nobody overwrites a shard still being read). */
static void gather_fn(void *user)
{
    gather_rank *gr = user;
    gather_op *op = gr->op;
    size_t r = gr->rank;
    ddo__mutex_lock(&op->mu);
    op->arrived++;
    ddo__cond_broadcast(&op->cv);
    wait_for(op, &op->arrived);
    bool go = !op->failed;
    ddo__mutex_unlock(&op->mu);
    for (size_t k = 0; go && k < op->n; k++) {
        void *to = (void *)(uintptr_t)(op->recv[r] + k * op->bytes);
        const void *from = (const void *)(uintptr_t)op->send[k];
        if (to != from)
            memmove(to, from, (size_t)op->bytes);
    }
    ddo__mutex_lock(&op->mu);
    op->copied++;
    ddo__cond_broadcast(&op->cv);
    wait_for(op, &op->copied);
    bool last = --op->left == 0;
    ddo__mutex_unlock(&op->mu);
    if (last) {
        ddo__cond_destroy(&op->cv);
        ddo__mutex_destroy(&op->mu);
        free(op);
    }
}

static int emulated_all_gather(ddo__comm *c, const uint64_t *send, const uint64_t *recv,
                               uint64_t bytes, void *const *streams, ddo__errbuf *eb)
{
    gather_op *op = ddo__calloc(1, sizeof(*op));
    if (op == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "all-gather: out of host memory");
    op->n = op->expected = c->n;
    op->bytes = bytes;
    ddo__mutex_init(&op->mu);
    ddo__cond_init(&op->cv);
    for (size_t r = 0; r < c->n; r++) {
        op->send[r] = send[r];
        op->recv[r] = recv[r];
        op->ranks[r] = (gather_rank){ op, r };
    }
    op->left = c->n;
    int rc = 0;
    size_t queued = 0;
    for (; queued < c->n && rc == 0; queued++) {
        rc = ddo__dev_host_fn(c->devs[queued], streams[queued], gather_fn, &op->ranks[queued]);
        if (rc != 0)
            break;
    }
    if (rc == 0)
        return 0;
    /* The ranks queued give up (no copies); the last of them frees op. */
    ddo__mutex_lock(&op->mu);
    op->failed = true;
    op->expected = queued;
    op->left = queued;
    bool none = queued == 0;
    ddo__cond_broadcast(&op->cv);
    ddo__mutex_unlock(&op->mu);
    if (none) {
        ddo__cond_destroy(&op->cv);
        ddo__mutex_destroy(&op->mu);
        free(op);
    }
    return ddo__fail(eb, rc, "all-gather: rank %zu: %s", queued, ddo_device_error(c->devs[queued]));
}

static int nccl_all_gather(ddo__comm *c, const uint64_t *send, const uint64_t *recv, uint64_t bytes,
                           void *const *streams, ddo__errbuf *eb)
{
    int r = nccl.GroupStart();
    for (size_t k = 0; k < c->n && r == 0; k++)
        r = nccl.AllGather((const void *)(uintptr_t)send[k], (void *)(uintptr_t)recv[k],
                           (size_t)bytes, NCCL_UINT8, c->comms[k], streams[k]);
    int e = nccl.GroupEnd();
    if (r == 0)
        r = e;
    if (r != 0)
        return ddo__fail(eb, DDO_E_DEVICE, "ncclAllGather: %s (%d)", nccl.GetErrorString(r), r);
    return 0;
}

static int nccl_init(ddo__comm *c, const char *path, ddo__errbuf *eb)
{
    int rc = nvls_off(eb);
    if (rc == 0)
        rc = nccl_load(path, eb);
    if (rc != 0)
        return rc;
    int ord[DDO__COMM_MAX];
    for (size_t r = 0; r < c->n; r++) {
        ddo_device_caps caps;
        if (ddo_device_caps_get(c->devs[r], &caps) != 0)
            return ddo__fail_from_last(eb, DDO_E_DEVICE);
        ord[r] = caps.ordinal;
    }
    int r = nccl.CommInitAll(c->comms, (int)c->n, ord);
    if (r != 0) {
        memset(c->comms, 0, sizeof(c->comms));
        return ddo__fail(eb, DDO_E_DEVICE, "ncclCommInitAll over %zu GPUs: %s (%d)", c->n,
                         nccl.GetErrorString(r), r);
    }
    c->nccl = true;
    snprintf(c->engine, sizeof(c->engine), "NCCL %d", nccl.version);
    return 0;
}

int ddo__comm_create(ddo_device *const *devs, size_t n, const char *nccl_path, ddo__comm **out,
                     ddo__errbuf *eb)
{
    *out = NULL;
    if (devs == NULL || n < 2 || n > DDO__COMM_MAX)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "communicator: 2 to %d devices, not %zu",
                         DDO__COMM_MAX, n);
    for (size_t r = 0; r < n; r++) {
        if (devs[r] == NULL || ddo__device_ops_of(devs[r]) != ddo__device_ops_of(devs[0]))
            return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                             "communicator: rank %zu is not a device of rank 0's kind", r);
        for (size_t k = 0; k < r; k++)
            if (devs[k] == devs[r])
                return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                                 "communicator: ranks %zu and %zu are one device", k, r);
    }
    ddo__comm *c = ddo__calloc(1, sizeof(*c));
    if (c == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "communicator: out of host memory");
    c->n = n;
    memcpy(c->devs, devs, n * sizeof(*devs));
    snprintf(c->engine, sizeof(c->engine), "emulated (cpu)");
    if (!ddo__device_is_cpu(devs[0])) {
        int rc = nccl_init(c, nccl_path, eb);
        if (rc != 0) {
            free(c);
            return rc;
        }
    }
    *out = c;
    return 0;
}

void ddo__comm_destroy(ddo__comm *c)
{
    if (c == NULL)
        return;
    for (size_t r = 0; c->nccl && r < c->n; r++)
        if (c->comms[r] != NULL)
            (void)nccl.CommDestroy(c->comms[r]);
    free(c);
}

size_t ddo__comm_size(const ddo__comm *c)
{
    return c != NULL ? c->n : 0;
}

const char *ddo__comm_engine(const ddo__comm *c)
{
    return c != NULL ? c->engine : "";
}

int ddo__comm_all_gather(ddo__comm *c, const uint64_t *send, const uint64_t *recv, uint64_t bytes,
                         void *const *streams, ddo__errbuf *eb)
{
    if (c == NULL || send == NULL || recv == NULL || streams == NULL)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "all-gather: NULL argument");
    if (bytes == 0)
        return 0;
    return c->nccl ? nccl_all_gather(c, send, recv, bytes, streams, eb)
                   : emulated_all_gather(c, send, recv, bytes, streams, eb);
}

/* ---- the split upload ---- */

uint64_t ddo__split_shard(uint64_t bytes, size_t n)
{
    return n == 0 ? bytes : (bytes + n - 1) / n;
}

int ddo__split_upload(ddo__comm *c, const void *host, uint64_t bytes, const uint64_t *dst,
                      void *const *streams, ddo__errbuf *eb)
{
    if (c == NULL || host == NULL || dst == NULL || streams == NULL)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "split upload: NULL argument");
    uint64_t shard = ddo__split_shard(bytes, c->n);
    uint64_t send[DDO__COMM_MAX];
    for (size_t r = 0; r < c->n; r++) {
        uint64_t at = r * shard;
        uint64_t len = at >= bytes ? 0 : (bytes - at < shard ? bytes - at : shard);
        send[r] = dst[r] + at;
        int rc = ddo__dev_copy_h2d(c->devs[r], send[r], (const unsigned char *)host + at,
                                   (size_t)len, streams[r]);
        if (rc != 0)
            return ddo__fail(eb, rc, "split upload: rank %zu: %s", r, ddo_device_error(c->devs[r]));
    }
    return ddo__comm_all_gather(c, send, dst, shard, streams, eb);
}
