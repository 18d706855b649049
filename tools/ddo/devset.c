/*
 * devset.c - a plan's device set as the tool's commands open it (see devset.h).
 */
#include "devset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tool_devset_open(tool_devset *d, const ddo_plan *plan)
{
    ddo_plan_info info = DDO_PLAN_INFO_INIT;
    if (ddo_plan_info_get(plan, &info) != 0 || info.device_mode == DDO_DEVICE_MODE_SINGLE ||
        (d->count > 0 && d->mode == info.device_mode))
        return 0;
    tool_devset_close(d); /* a case of the other mode: its devices differ */
    const char *rest = strchr(info.devices, ',');
    snprintf(d->names, sizeof d->names, "%s", rest != NULL ? rest + 1 : "");
    /* Donor mode takes the store (the set's second device) alone. */
    if (info.device_mode == DDO_DEVICE_MODE_DONOR)
        d->names[strcspn(d->names, ",")] = '\0';
    for (const char *p = d->names; *p != '\0' && d->count < TOOL_DEVSET_MAX;) {
        char spec[64];
        size_t len = strcspn(p, ",");
        snprintf(spec, sizeof spec, "%.*s", (int)(len < sizeof spec ? len : sizeof spec - 1), p);
        int rc = ddo_device_create(spec, NULL, &d->dev[d->count]);
        if (rc != 0) {
            tool_devset_close(d);
            return rc;
        }
        d->count++;
        p += len + (p[len] == ',');
    }
    d->mode = info.device_mode;
    return 0;
}

void tool_devset_session(const tool_devset *d, const ddo_plan *plan, ddo_session_options *so)
{
    ddo_plan_info info = DDO_PLAN_INFO_INIT;
    if (d->count == 0 || ddo_plan_info_get(plan, &info) != 0 || info.device_mode != d->mode)
        return;
    if (d->mode == DDO_DEVICE_MODE_DONOR) {
        so->store_device = d->dev[0];
    } else {
        so->split_devices = (ddo_device *const *)d->dev;
        so->split_device_count = d->count;
    }
}

int tool_devset_split(const tool_devset *d, const ddo_plan *plan)
{
    ddo_plan_info info = DDO_PLAN_INFO_INIT;
    return d->count > 0 && d->mode == DDO_DEVICE_MODE_SPLIT &&
           ddo_plan_info_get(plan, &info) == 0 && info.device_mode == DDO_DEVICE_MODE_SPLIT;
}

void tool_devset_close(tool_devset *d)
{
    for (size_t k = 0; k < d->count; k++)
        ddo_device_destroy(d->dev[k]);
    d->count = 0;
    d->mode = DDO_DEVICE_MODE_SINGLE;
}

int tool_devset_compare(ddo_session *s, const ddo_checkpoint *ck, size_t t, size_t split_count,
                        uint64_t *checked, uint64_t *differ)
{
    const ddo_tensor_info *ti = ddo_checkpoint_tensor(ck, t);
    void *p0 = NULL;
    if (ti == NULL || ddo_session_device_tensor_address(s, 0, t, &p0) != 0)
        return 0; /* skipped */
    size_t n = (size_t)ti->nbytes;
    unsigned char *first = malloc(n ? n : 1), *other = malloc(n ? n : 1);
    int rc = first == NULL || other == NULL ? DDO_E_NO_MEMORY
                                            : ddo_session_device_tensor_read(s, 0, t, first, n);
    for (size_t k = 1; k <= split_count && rc == 0; k++) {
        rc = ddo_session_device_tensor_read(s, k, t, other, n);
        (*checked)++;
        if (rc == 0 && memcmp(first, other, n) != 0)
            (*differ)++;
    }
    free(first);
    free(other);
    return rc;
}
