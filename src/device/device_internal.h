/*
 * device_internal.h - what device.c (the public handles, the sorted tables, the
 * counters, usage and fault accessors) and device_calls.c (the checked wrappers
 * and their bookkeeping) share: the layout of a device and of a stream. Private
 * to those two files; every other module goes through device.h.
 */
#ifndef DDO_DEVICE_INTERNAL_H
#define DDO_DEVICE_INTERNAL_H

#include "device/device.h"

#include "os/thread.h"
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

enum { STAT_CALLS, STAT_FAILURES, STAT_BYTES, STAT_NS, STAT_COUNT };

typedef struct fault {
    uint64_t nth;  /* the call (counted from injection) that fails first */
    uint64_t seen; /* calls since injection */
    int code;
    bool persistent;
    bool active;
} fault;

typedef struct gauge {
    uint64_t cur, peak;
} gauge;

struct ddo_device {
    const ddo__device_ops *ops;
    void *st;
    char spec[32];
    ddo_device_caps caps; /* as read at creation (granularity, name) */
    uint64_t granularity;

    ddo__mutex err_lock;
    ddo__errbuf err;

    _Atomic uint64_t stats[DDO__OP_COUNT][STAT_COUNT];

    ddo__mutex fault_lock;
    _Atomic int fault_armed[DDO__OP_COUNT];
    fault faults[DDO__OP_COUNT];

    ddo__mutex usage_lock;
    ddo__devtab phys, mem, pinned, registered; /* key -> size, for releases */
    gauge device_bytes, pinned_bytes, registered_bytes, va_bytes, mapped_bytes;
};

struct ddo_stream {
    ddo_device *dev;
    void *native;
    bool borrowed; /* ddo_stream_wrap: the host's stream, unwrapped at destroy */
};

#endif
