/*
 * plan_devset.c - the device set of a plan (docs/multi-gpu.md): which devices the plan uses
 * (the devices option, the computing device first), how (device_mode: donor or split), what
 * the store device holds in donor mode (every streamed unit, at its slot layout) against its
 * limit, and the device->device link the cost of a unit's copy depends on. The plan is pure:
 * the store device's free memory and the measured link come in the plan inputs.
 *
 * The JSON keeps the set in one object, "device_set", written only for a set, so that a
 * single-device plan reads and writes as it always did.
 */
#include "config/config.h"
#include "plan/plan.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const mode_names[] = { "single", "donor", "split" };

/* The set as one comma-separated string; DDO_E_CONFIG for a device named twice. */
static int join_devices(const ddo__strlist *l, char **out)
{
    size_t len = 1;
    for (size_t i = 0; i < l->count; i++) {
        for (size_t j = 0; j < i; j++)
            if (strcmp(l->items[i], l->items[j]) == 0)
                return ddo__fail(NULL, DDO_E_CONFIG, "devices: \"%s\" is listed twice",
                                 l->items[i]);
        len += strlen(l->items[i]) + 1;
    }
    char *s = ddo__calloc(1, len);
    if (s == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: devices");
    for (size_t i = 0; i < l->count; i++) {
        if (i > 0)
            strcat(s, ",");
        strcat(s, l->items[i]);
    }
    *out = s;
    return 0;
}

/* The bytes a donor store holds: every streamed unit at its slot layout. */
static uint64_t store_bytes(const ddo_plan *p)
{
    uint64_t total = 0;
    for (size_t u = 0; u < p->unit_count; u++)
        if (!p->units[u].resident && p->units[u].bytes > 0)
            total = ddo__sat_add_u64(total, p->units[u].span_bytes);
    return total;
}

/* Donor mode prices a streamed unit's transfer at the device->device rate (when known and the
 * cost model is on): its bytes come from the store device, not over the host bus. Residency
 * was chosen before, at the bus rate. */
static void price_at_peer(ddo_plan *p)
{
    if (!p->cost_enabled || !(p->peer_bytes_per_s > 0))
        return;
    for (size_t u = 0; u < p->unit_count; u++) {
        ddo__plan_unit *un = &p->units[u];
        if (!un->resident)
            un->transfer_s = (double)un->bytes / p->peer_bytes_per_s;
    }
    for (size_t u = 0; u < p->unit_count; u++) {
        ddo__plan_unit *un = &p->units[u];
        size_t prev = u > 0 ? u - 1 : p->unit_count - 1;
        un->hidden = un->resident || un->transfer_s <= p->units[prev].compute_s;
    }
    ddo__decisions_set_str(&p->decisions, "transfer_rate", "device_to_device");
}

static int check_donor(ddo_plan *p, const ddo__options *o)
{
    if (p->weight_codec != DDO_WEIGHT_CODEC_NONE)
        return ddo__fail(NULL, DDO_E_CONFIG,
                         "devices: donor mode stores raw bytes on the store device; "
                         "weight_codec=%s is not supported with it (set weight_codec=none)",
                         o->weight_codec);
    p->store_bytes = store_bytes(p);
    uint64_t limit = ddo__gb_to_bytes(o->store_device_budget_gb);
    const char *from = "store_device_budget_gb";
    if (limit == 0) {
        limit = p->inputs.store_free_bytes;
        from = "the store device's free memory";
    }
    p->store_limit = limit;
    price_at_peer(p);
    if (limit > 0 && p->store_bytes > limit)
        return ddo__fail(NULL, DDO_E_BUDGET,
                         "store device: the streamed units need %.2f GiB on %s, more than "
                         "the %.2f GiB of %s (raise store_device_budget_gb, or keep more "
                         "resident)",
                         ddo__bytes_to_gb(p->store_bytes), o->devices.items[1],
                         ddo__bytes_to_gb(limit), from);
    return 0;
}

bool ddo__plan_devset_donor(const ddo__options *o)
{
    return o->devices.count >= 2 &&
           (o->device_mode == NULL || strcmp(o->device_mode, "split") != 0);
}

int ddo__plan_devset(ddo_plan *p, const ddo__options *o)
{
    const ddo__strlist *l = &o->devices;
    p->device_mode = DDO_DEVICE_MODE_SINGLE;
    p->device_count = 1;
    if (l->count == 0)
        return 0;
    if (l->count == 1)
        return ddo__fail(NULL, DDO_E_CONFIG,
                         "devices: \"%s\" alone is no set: list two or more devices, the "
                         "computing one first (or use execution_device)",
                         l->items[0]);
    int rc = join_devices(l, &p->devices);
    if (rc != 0)
        return rc;
    p->device_count = l->count;
    bool donor = ddo__plan_devset_donor(o);
    p->device_mode = donor ? DDO_DEVICE_MODE_DONOR : DDO_DEVICE_MODE_SPLIT;
    p->peer_bytes_per_s =
        o->peer_link_gbps > 0 ? o->peer_link_gbps * 1e9 : p->inputs.peer_bytes_per_s;
    if (donor && l->count != 2)
        return ddo__fail(NULL, DDO_E_CONFIG,
                         "devices: donor mode takes two devices (the computing one, then the "
                         "store), not %zu",
                         l->count);
    if (donor)
        return check_donor(p, o);
    return 0;
}

/* ---- JSON ---- */

static json_t *jint(uint64_t v)
{
    return json_integer(v > (uint64_t)INT64_MAX ? (json_int_t)INT64_MAX : (json_int_t)v);
}

int ddo__plan_devset_json(const ddo_plan *p, json_t *root)
{
    if (p->device_mode == DDO_DEVICE_MODE_SINGLE)
        return 0;
    json_t *o = json_object();
    if (o == NULL || json_object_set_new(root, "device_set", o) != 0)
        return DDO_E_NO_MEMORY;
    int bad = 0;
    bad |= json_object_set_new(o, "mode", json_string(mode_names[p->device_mode]));
    bad |= json_object_set_new(o, "devices", json_string(p->devices ? p->devices : ""));
    bad |= json_object_set_new(o, "device_count", jint(p->device_count));
    bad |= json_object_set_new(o, "store_bytes", jint(p->store_bytes));
    bad |= json_object_set_new(o, "store_limit", jint(p->store_limit));
    bad |= json_object_set_new(o, "peer_bytes_per_s", json_real(p->peer_bytes_per_s));
    bad |= json_object_set_new(o, "inputs_store_free_bytes", jint(p->inputs.store_free_bytes));
    bad |= json_object_set_new(o, "inputs_peer_bytes_per_s", json_real(p->inputs.peer_bytes_per_s));
    return bad != 0 ? DDO_E_NO_MEMORY : 0;
}

static bool get_u64(json_t *o, const char *key, uint64_t *v)
{
    json_t *j = json_object_get(o, key);
    if (!json_is_integer(j) || json_integer_value(j) < 0)
        return false;
    *v = (uint64_t)json_integer_value(j);
    return true;
}

static bool get_real(json_t *o, const char *key, double *v)
{
    json_t *j = json_object_get(o, key);
    if (!json_is_number(j) || !(json_number_value(j) >= 0))
        return false;
    *v = json_number_value(j);
    return true;
}

const char *ddo__plan_devset_read(ddo_plan *p, json_t *root)
{
    p->device_mode = DDO_DEVICE_MODE_SINGLE;
    p->device_count = 1;
    json_t *o = json_object_get(root, "device_set");
    if (o == NULL)
        return NULL;
    json_t *mode = json_object_get(o, "mode");
    json_t *devs = json_object_get(o, "devices");
    if (!json_is_string(mode) || !json_is_string(devs))
        return "device_set";
    const char *m = json_string_value(mode);
    if (strcmp(m, "donor") == 0)
        p->device_mode = DDO_DEVICE_MODE_DONOR;
    else if (strcmp(m, "split") == 0)
        p->device_mode = DDO_DEVICE_MODE_SPLIT;
    else
        return "device_set.mode";
    p->devices = ddo__strdup(json_string_value(devs));
    if (p->devices == NULL)
        return "(out of memory)";
    uint64_t count = 0;
    bool ok = get_u64(o, "device_count", &count) && count >= 2 &&
              get_u64(o, "store_bytes", &p->store_bytes) &&
              get_u64(o, "store_limit", &p->store_limit) &&
              get_real(o, "peer_bytes_per_s", &p->peer_bytes_per_s) &&
              get_u64(o, "inputs_store_free_bytes", &p->inputs.store_free_bytes) &&
              get_real(o, "inputs_peer_bytes_per_s", &p->inputs.peer_bytes_per_s);
    p->device_count = (size_t)count;
    return ok ? NULL : "device_set";
}

const char *ddo__device_mode_name(ddo_device_mode m)
{
    return (unsigned)m < DDO_ARRAY_LEN(mode_names) ? mode_names[m] : "?";
}
