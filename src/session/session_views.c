/*
 * session_views.c - what a framework host needs to see ddo's device memory as its own
 * tensors: a tensor's address while its unit is leased, session-long addresses on the VMM
 * routes, every address of a leased unit in one call, DLPack views that keep the session
 * alive while they live, and the host bytes of a tensor whose host copy the session owns.
 */
#include "session/session.h"

#include "device/device.h"

#include <stdlib.h>
#include <string.h>

/* DLPack v0 (dlpack.h 0.6-0.8, the ABI torch.utils.dlpack.from_dlpack takes in a
 * "dltensor" capsule): written out here, no header needed. */
typedef struct dl_device {
    int32_t device_type; /* kDLCPU 1, kDLCUDA 2 */
    int32_t device_id;
} dl_device;

typedef struct dl_dtype {
    uint8_t code; /* kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4 */
    uint8_t bits;
    uint16_t lanes;
} dl_dtype;

typedef struct dl_tensor {
    void *data;
    dl_device device;
    int32_t ndim;
    dl_dtype dtype;
    int64_t *shape;
    int64_t *strides; /* NULL: compact row-major */
    uint64_t byte_offset;
} dl_tensor;

typedef struct dl_managed {
    dl_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct dl_managed *self);
} dl_managed;

/* A view and the storage of its shape. */
typedef struct view {
    dl_managed m;
    int64_t shape[DDO_MAX_DIMS];
    ddo_session *s;
    size_t tensor; /* DDO__NONE: a unit-wide view (of `unit`) */
    size_t unit;
} view;

size_t ddo_session_view_count(const ddo_session *s)
{
    if (s == NULL)
        return 0;
    size_t refs = atomic_load(&((ddo_session *)s)->refs);
    return refs > 0 ? refs - 1 : 0;
}

size_t ddo_session_tensor_view_count(const ddo_session *s, size_t tensor)
{
    if (s == NULL || s->tensor_views == NULL || tensor >= ddo_checkpoint_tensor_count(s->ck))
        return 0;
    return atomic_load(&s->tensor_views[tensor]);
}

size_t ddo_session_unit_view_count(const ddo_session *s, size_t unit)
{
    if (s == NULL || unit >= s->unit_count)
        return 0;
    size_t n = s->unit_views != NULL ? atomic_load(&s->unit_views[unit]) : 0;
    if (s->tensor_views == NULL)
        return n;
    size_t count = 0;
    const size_t *tensors = ddo_plan_unit_tensors(s->plan, unit, &count);
    for (size_t i = 0; i < count; i++) {
        ddo_tensor_location loc;
        if (ddo_plan_tensor_location(s->plan, tensors[i], &loc) == 0 &&
            loc.placement == DDO_PLACEMENT_STREAMED) /* (a resident one's view lives on) */
            n += atomic_load(&s->tensor_views[tensors[i]]);
    }
    return n;
}

int ddo_session_tensor_address(ddo_session *s, size_t tensor, void **device_ptr)
{
    if (s == NULL || device_ptr == NULL)
        return ddo__fail(s != NULL ? &s->err : NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_tensor_address: session and device_ptr are required");
    ddo_tensor_location loc;
    if (tensor >= ddo_checkpoint_tensor_count(s->ck) ||
        ddo_plan_tensor_location(s->plan, tensor, &loc) != 0)
        return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_tensor_address: tensor %zu out of range", tensor);
    const char *name = ddo__session_tensor_name(s, tensor);
    if (loc.placement == DDO_PLACEMENT_SKIPPED)
        return ddo__fail(&s->err, DDO_E_NOT_FOUND,
                         "tensor \"%s\" is skipped (skip_modules_pattern): it has no device "
                         "address",
                         name);
    if (s->unloaded)
        return ddo__fail(&s->err, DDO_E_STATE,
                         "tensor \"%s\": session unloaded: call ddo_session_reload", name);
    uint64_t addr;
    if (loc.placement == DDO_PLACEMENT_RESIDENT) {
        addr = s->arena + loc.offset;
    } else {
        if (loc.unit >= s->unit_count)
            return ddo__fail(&s->err, DDO_E_INTERNAL, "tensor \"%s\": no unit", name);
        ddo__unit_rt *u = &s->units[loc.unit];
        if (!u->leased || u->slot == DDO__NONE)
            return ddo__fail(&s->err, DDO_E_STATE,
                             "tensor \"%s\": unit \"%s\" is not leased: acquire it first", name,
                             u->name);
        addr = ddo__route_per_weight(s->route) ? s->w_va[tensor]
               : ddo__route_maps(s->route)     ? u->va + loc.offset
                                               : s->slots[u->slot].ptr + loc.offset;
    }
    *device_ptr = (void *)(uintptr_t)addr;
    return 0;
}

int ddo_session_device_tensor_address(ddo_session *s, size_t device, size_t tensor,
                                      void **device_ptr)
{
    void *p0 = NULL;
    int rc = ddo_session_tensor_address(s, tensor, &p0);
    if (rc != 0 || device == 0) {
        if (rc == 0)
            *device_ptr = p0;
        return rc;
    }
    if (device >= s->split_n)
        return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_device_tensor_address: device %zu out of range (the "
                         "session drives %zu)",
                         device, s->split_n > 0 ? s->split_n : 1);
    ddo_tensor_location loc;
    (void)ddo_plan_tensor_location(s->plan, tensor, &loc);
    size_t slot = loc.placement == DDO_PLACEMENT_STREAMED ? s->units[loc.unit].slot : 0;
    uint64_t a = 0;
    if (ddo__session_split_address(s, device, slot, &loc, &a) != 0)
        return ddo__fail(&s->err, DDO_E_INTERNAL,
                         "ddo_session_device_tensor_address: device %zu holds nothing", device);
    *device_ptr = (void *)(uintptr_t)a;
    return 0;
}

int ddo_session_device_tensor_read(ddo_session *s, size_t device, size_t tensor, void *dst,
                                   size_t dst_bytes)
{
    void *p = NULL;
    int rc = ddo_session_device_tensor_address(s, device, tensor, &p);
    if (rc != 0)
        return rc;
    ddo_tensor_location loc;
    (void)ddo_plan_tensor_location(s->plan, tensor, &loc);
    if (dst == NULL || dst_bytes < loc.nbytes)
        return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_device_tensor_read: tensor \"%s\" needs %llu bytes at dst",
                         ddo__session_tensor_name(s, tensor), (unsigned long long)loc.nbytes);
    ddo_device *dev = device == 0 ? s->dev : s->split_dev[device];
    rc = ddo__dev_copy_d2h(dev, dst, (uint64_t)(uintptr_t)p, (size_t)loc.nbytes);
    if (device != 0)
        ddo__session_split_rebind(s);
    if (rc != 0)
        return ddo__session_fail_ctx(&s->err, rc, "ddo_session_device_tensor_read: device %zu",
                                     device);
    return 0;
}

/* The address of a resident tensor, or of a streamed one at `base` (its unit's range, slot
 * or weight range). */
static uint64_t tensor_at(const ddo_session *s, size_t tensor, const ddo_tensor_location *loc,
                          uint64_t base)
{
    if (loc->placement == DDO_PLACEMENT_RESIDENT)
        return s->arena + loc->offset;
    return ddo__route_per_weight(s->route) ? s->w_va[tensor] : base + loc->offset;
}

static int locate(ddo_session *s, size_t tensor, const char *fn, ddo_tensor_location *loc)
{
    if (tensor >= ddo_checkpoint_tensor_count(s->ck) ||
        ddo_plan_tensor_location(s->plan, tensor, loc) != 0)
        return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT, "%s: tensor %zu out of range", fn,
                         tensor);
    if (loc->placement == DDO_PLACEMENT_SKIPPED)
        return ddo__fail(&s->err, DDO_E_NOT_FOUND,
                         "%s: tensor \"%s\" is skipped (skip_modules_pattern): it has no device "
                         "address",
                         fn, ddo_checkpoint_tensor(s->ck, tensor)->name);
    if (loc->placement == DDO_PLACEMENT_STREAMED && loc->unit >= s->unit_count)
        return ddo__fail(&s->err, DDO_E_INTERNAL, "%s: tensor \"%s\" has no unit", fn,
                         ddo_checkpoint_tensor(s->ck, tensor)->name);
    return 0;
}

/* Where tensor is: its session-long address on the VMM routes, else (unless stable_only) its
 * leased slot's. */
static int address_of(ddo_session *s, size_t tensor, bool stable_only, const char *fn,
                      uint64_t *addr)
{
    ddo_tensor_location loc;
    int rc = locate(s, tensor, fn, &loc);
    if (rc != 0)
        return rc;
    uint64_t base = 0;
    if (loc.placement == DDO_PLACEMENT_STREAMED) {
        const ddo__unit_rt *u = &s->units[loc.unit];
        const char *name = ddo_checkpoint_tensor(s->ck, tensor)->name;
        if (ddo__route_maps(s->route))
            base = u->va;
        else if (stable_only)
            return ddo__fail(&s->err, DDO_E_UNSUPPORTED,
                             "%s: route %s moves tensor \"%s\" between slots: its address is "
                             "valid only while its unit is leased (ddo_session_tensor_address)",
                             fn, s->route_name, name);
        else if (u->leased && u->slot != DDO__NONE)
            base = s->slots[u->slot].ptr;
        else
            return ddo__fail(&s->err, DDO_E_STATE,
                             "%s: tensor \"%s\": unit \"%s\" is not leased: acquire it first", fn,
                             name, u->name);
    }
    *addr = tensor_at(s, tensor, &loc, base);
    return 0;
}

int ddo_session_tensor_stable_address(ddo_session *s, size_t tensor, void **device_ptr)
{
    static const char fn[] = "ddo_session_tensor_stable_address";
    if (s == NULL || device_ptr == NULL)
        return ddo__fail(s != NULL ? &s->err : NULL, DDO_E_INVALID_ARGUMENT,
                         "%s: session and device_ptr are required", fn);
    uint64_t a = 0;
    int rc = address_of(s, tensor, true, fn, &a);
    if (rc == 0)
        *device_ptr = (void *)(uintptr_t)a;
    return rc;
}

int ddo_session_unit_addresses(ddo_session *s, size_t unit, void **ptrs, size_t cap, size_t *n)
{
    static const char fn[] = "ddo_session_unit_addresses";
    int rc = ddo__session_check_unit(s, n != NULL && (ptrs != NULL || cap == 0), unit, fn,
                                     "session and n");
    if (rc != 0)
        return rc;
    if (s->unloaded)
        return ddo__fail(&s->err, DDO_E_STATE, "%s: unit \"%s\": session unloaded", fn,
                         s->units[unit].name);
    size_t count = 0;
    const size_t *tensors = ddo_plan_unit_tensors(s->plan, unit, &count);
    if (count > cap) {
        *n = count;
        return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                         "%s: unit \"%s\" has %zu tensors, room for %zu", fn, s->units[unit].name,
                         count, cap);
    }
    for (size_t i = 0; i < count; i++) {
        uint64_t a = 0;
        rc = address_of(s, tensors[i], false, fn, &a);
        if (rc != 0)
            return rc;
        ptrs[i] = (void *)(uintptr_t)a;
    }
    *n = count;
    return 0;
}

/* The DLPack type of a dtype; false when DLPack has none (moved as bytes). */
static bool dl_type_of(ddo_dtype dt, dl_dtype *out)
{
    static const struct {
        ddo_dtype dt;
        uint8_t code, bits;
    } map[] = {
        { DDO_DTYPE_U8, 1, 8 },   { DDO_DTYPE_I8, 0, 8 },   { DDO_DTYPE_I16, 0, 16 },
        { DDO_DTYPE_U16, 1, 16 }, { DDO_DTYPE_F16, 2, 16 }, { DDO_DTYPE_BF16, 4, 16 },
        { DDO_DTYPE_I32, 0, 32 }, { DDO_DTYPE_U32, 1, 32 }, { DDO_DTYPE_F32, 2, 32 },
        { DDO_DTYPE_F64, 2, 64 }, { DDO_DTYPE_I64, 0, 64 }, { DDO_DTYPE_U64, 1, 64 },
    };
    for (size_t i = 0; i < DDO_ARRAY_LEN(map); i++) {
        if (map[i].dt == dt) {
            out->code = map[i].code;
            out->bits = map[i].bits;
            out->lanes = 1;
            return true;
        }
    }
    return false;
}

static void view_deleter(dl_managed *m)
{
    view *v = (view *)m;
    ddo_session *s = v->s;
    if (v->tensor == DDO__NONE)
        atomic_fetch_sub(&s->unit_views[v->unit], 1);
    else
        atomic_fetch_sub(&s->tensor_views[v->tensor], 1);
    free(v);
    ddo_session_destroy(s);
}

/* Fills the view's type and shape: the tensor's own, or its bytes (uint8, one dimension). */
static int view_shape(ddo_session *s, const ddo_tensor_info *t, unsigned flags, view *v)
{
    dl_tensor *d = &v->m.dl_tensor;
    d->shape = v->shape;
    if ((flags & DDO_VIEW_BYTES) != 0 || !dl_type_of(t->dtype, &d->dtype)) {
        if ((flags & DDO_VIEW_BYTES) == 0)
            return ddo__fail(&s->err, DDO_E_UNSUPPORTED,
                             "ddo_session_tensor_dlpack: tensor \"%s\": DLPack has no %s type: "
                             "ask for its bytes (DDO_VIEW_BYTES) and view them as the dtype",
                             t->name, ddo_dtype_name(t->dtype));
        d->dtype = (dl_dtype){ 1, 8, 1 };
        d->ndim = 1;
        v->shape[0] = (int64_t)t->nbytes;
        return 0;
    }
    d->ndim = (int32_t)t->ndim;
    for (uint32_t k = 0; k < t->ndim; k++) {
        if (t->shape[k] > (uint64_t)INT64_MAX)
            return ddo__fail(&s->err, DDO_E_OVERFLOW,
                             "ddo_session_tensor_dlpack: tensor \"%s\": dimension %u too large",
                             t->name, k);
        v->shape[k] = (int64_t)t->shape[k];
    }
    return 0;
}

/* A view's device fields, data and deleter (the shape is the caller's). */
static int view_fill(ddo_session *s, view *v, uint64_t addr)
{
    if (s->view_device_id < 0) {
        ddo_device_caps caps;
        if (ddo_device_caps_get(s->dev, &caps) != 0)
            return ddo__fail_from_last(&s->err, DDO_E_DEVICE);
        s->view_device_id = caps.is_cpu ? 0 : caps.ordinal;
    }
    v->m.dl_tensor.data = (void *)(uintptr_t)addr;
    v->m.dl_tensor.device.device_type = ddo__device_is_cpu(s->dev) ? 1 : 2;
    v->m.dl_tensor.device.device_id = s->view_device_id;
    v->m.deleter = view_deleter;
    v->m.manager_ctx = v;
    v->s = s;
    return 0;
}

/* The per-tensor and per-unit view counters (made with the first view; the host thread makes
 * views, deleters only read the arrays). */
static int view_counters(ddo_session *s, const char *fn)
{
    if (s->tensor_views == NULL)
        s->tensor_views = ddo__calloc(ddo_checkpoint_tensor_count(s->ck), sizeof(atomic_size_t));
    if (s->unit_views == NULL && s->unit_count > 0)
        s->unit_views = ddo__calloc(s->unit_count, sizeof(atomic_size_t));
    if (s->tensor_views == NULL || (s->unit_views == NULL && s->unit_count > 0))
        return ddo__fail(&s->err, DDO_E_NO_MEMORY, "%s: out of host memory", fn);
    return 0;
}

int ddo_session_tensor_dlpack(ddo_session *s, size_t tensor, unsigned flags, void **managed)
{
    static const char fn[] = "ddo_session_tensor_dlpack";
    if (s == NULL || managed == NULL)
        return ddo__fail(s != NULL ? &s->err : NULL, DDO_E_INVALID_ARGUMENT,
                         "%s: session and managed are required", fn);
    uint64_t addr = 0;
    int rc = address_of(s, tensor, false, fn, &addr);
    if (rc == 0)
        rc = view_counters(s, fn);
    if (rc != 0)
        return rc;
    view *v = ddo__calloc(1, sizeof(*v));
    if (v == NULL)
        return ddo__fail(&s->err, DDO_E_NO_MEMORY, "%s: out of host memory", fn);
    rc = view_shape(s, ddo_checkpoint_tensor(s->ck, tensor), flags, v);
    if (rc == 0)
        rc = view_fill(s, v, addr);
    if (rc != 0) {
        free(v);
        return rc;
    }
    v->tensor = tensor;
    atomic_fetch_add(&s->tensor_views[tensor], 1);
    atomic_fetch_add(&s->refs, 1);
    *managed = &v->m;
    return 0;
}

/* The device range of unit's streamed tensors: its start (offset 0 of the unit, from the
 * address of its first streamed tensor: the others lie at their offsets from it) and the end
 * of its last tensor with bytes. */
static int unit_range(ddo_session *s, size_t unit, const char *fn, uint64_t *start, uint64_t *bytes)
{
    size_t first = 0;
    uint64_t end = ddo__session_unit_end(s, unit, &first);
    if (end == 0)
        return ddo__fail(&s->err, DDO_E_NOT_FOUND, "%s: unit \"%s\" streams no bytes", fn,
                         s->units[unit].name);
    ddo_tensor_location loc;
    uint64_t a = 0;
    if (ddo_plan_tensor_location(s->plan, first, &loc) != 0)
        return ddo__fail_from_last(&s->err, DDO_E_INTERNAL);
    int rc = address_of(s, first, false, fn, &a);
    if (rc != 0)
        return rc;
    *start = a - loc.offset;
    *bytes = end;
    return 0;
}

int ddo_session_unit_dlpack(ddo_session *s, size_t unit, void **managed)
{
    static const char fn[] = "ddo_session_unit_dlpack";
    int rc = ddo__session_check_unit(s, managed != NULL, unit, fn, "session and managed");
    if (rc != 0)
        return rc;
    if (s->unloaded)
        return ddo__fail(&s->err, DDO_E_STATE, "%s: unit \"%s\": session unloaded", fn,
                         s->units[unit].name);
    if (ddo__route_per_weight(s->route))
        return ddo__fail(&s->err, DDO_E_UNSUPPORTED,
                         "%s: route %s maps each weight apart: view its tensors one by one "
                         "(ddo_session_tensor_dlpack)",
                         fn, s->route_name);
    uint64_t start = 0, bytes = 0;
    rc = unit_range(s, unit, fn, &start, &bytes);
    if (rc == 0)
        rc = view_counters(s, fn);
    if (rc != 0)
        return rc;
    if (bytes > (uint64_t)INT64_MAX)
        return ddo__fail(&s->err, DDO_E_OVERFLOW, "%s: unit \"%s\" too large", fn,
                         s->units[unit].name);
    view *v = ddo__calloc(1, sizeof(*v));
    if (v == NULL)
        return ddo__fail(&s->err, DDO_E_NO_MEMORY, "%s: out of host memory", fn);
    rc = view_fill(s, v, start);
    if (rc != 0) {
        free(v);
        return rc;
    }
    v->m.dl_tensor.shape = v->shape;
    v->m.dl_tensor.dtype = (dl_dtype){ 1, 8, 1 };
    v->m.dl_tensor.ndim = 1;
    v->shape[0] = (int64_t)bytes;
    v->tensor = DDO__NONE;
    v->unit = unit;
    atomic_fetch_add(&s->unit_views[unit], 1);
    atomic_fetch_add(&s->refs, 1);
    *managed = &v->m;
    return 0;
}

int ddo_session_tensor_loads(ddo_session *s, size_t tensor, uint64_t *loads)
{
    if (s == NULL || loads == NULL)
        return ddo__fail(s != NULL ? &s->err : NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_tensor_loads: session and loads are required");
    ddo_tensor_location loc;
    if (tensor >= ddo_checkpoint_tensor_count(s->ck) ||
        ddo_plan_tensor_location(s->plan, tensor, &loc) != 0)
        return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_tensor_loads: tensor %zu out of range", tensor);
    if (loc.placement == DDO_PLACEMENT_SKIPPED)
        return ddo__fail(&s->err, DDO_E_NOT_FOUND,
                         "ddo_session_tensor_loads: tensor \"%s\" is skipped (not on the device)",
                         ddo_checkpoint_tensor(s->ck, tensor)->name);
    ddo__mutex_lock(&s->mu);
    bool streamed = loc.placement == DDO_PLACEMENT_STREAMED && !s->units[loc.unit].resident;
    *loads = streamed ? s->units[loc.unit].loads : s->resident_loads;
    ddo__mutex_unlock(&s->mu);
    return 0;
}

/* ---- host copies ---- */

int ddo_session_tensor_host_owned(ddo_session *s, size_t tensor, bool *owned)
{
    if (s == NULL || owned == NULL)
        return ddo__fail(s != NULL ? &s->err : NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_tensor_host_owned: session and owned are required");
    size_t n = ddo_checkpoint_tensor_count(s->ck);
    if (tensor >= n)
        return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_tensor_host_owned: tensor %zu out of range (%zu tensors)",
                         tensor, n);
    *owned = ddo__source_owns_host_tensor(s->source, tensor); /* host tensors only */
    return 0;
}

int ddo_session_tensor_read_host(ddo_session *s, size_t tensor, void *dst, uint64_t dst_bytes)
{
    static const char fn[] = "ddo_session_tensor_read_host";
    if (s == NULL || dst == NULL)
        return ddo__fail(s != NULL ? &s->err : NULL, DDO_E_INVALID_ARGUMENT,
                         "%s: session and dst are required", fn);
    size_t n = ddo_checkpoint_tensor_count(s->ck);
    if (tensor >= n)
        return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                         "%s: tensor %zu out of range (%zu tensors)", fn, tensor, n);
    if (s->source == NULL)
        return ddo__fail(&s->err, DDO_E_NOT_FOUND, "%s: tensor \"%s\": no host copy of it is kept",
                         fn, ddo_checkpoint_tensor(s->ck, tensor)->name);
    return ddo__source_copy_out(s->source, tensor, dst, dst_bytes, &s->err);
}
