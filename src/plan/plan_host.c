/*
 * plan_host.c - the host side of a plan (docs/plan.md): which streamed units the retained store
 * keeps in host RAM, which of those are registered for the copy engine (a caller's host tensors
 * registered in place, host_pins.h), and the staging windows that carry everything else. Part of
 * the build (plan_build.h).
 */
#include "plan/plan_build.h"

#include "codec/codec.h"
#include "os/platform.h"
#include "os/sysinfo.h"
#include "plan/pin_layout.h"

#include <stdlib.h>
#include <string.h>
/* Chooses whole units (indices into list) under budget with `how`; marks them in flags. */
static int choose_units(const ddo_plan *p, const size_t *list, size_t count, uint64_t budget,
                        ddo_selection how, bool *flags, uint64_t *taken)
{
    uint64_t *sizes = ddo__calloc(count ? count : 1, sizeof(*sizes));
    size_t *order = ddo__calloc(count ? count : 1, sizeof(*order));
    size_t *chosen = ddo__calloc(count ? count : 1, sizeof(*chosen));
    if (sizes == NULL || order == NULL || chosen == NULL) {
        free(sizes);
        free(order);
        free(chosen);
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: unit selection");
    }
    for (size_t k = 0; k < count; k++)
        sizes[k] = p->units[list[k]].bytes;
    ddo__select_order(sizes, count, budget, how, order);
    size_t n = ddo__select_greedy(sizes, order, count, budget, chosen, taken);
    for (size_t k = 0; k < n; k++)
        flags[list[chosen[k]]] = true;
    free(sizes);
    free(order);
    free(chosen);
    return 0;
}

/* The cost of re-reading each streamed unit from the file (the cost model on and a file rate
 * known; else nothing and false): its bytes at the file rate, and the stall that read adds to
 * the unit's load beyond what the previous unit's compute hides (its bus transfer is paid
 * either way, so only the read's share of the unhidden time counts). */
static bool reread_costs(ddo_plan *p, double file_rate)
{
    if (!p->cost_enabled || !(file_rate > 0.0))
        return false;
    for (size_t u = 0; u < p->unit_count; u++) {
        ddo__plan_unit *un = &p->units[u];
        const ddo__plan_unit *prev = &p->units[u > 0 ? u - 1 : p->unit_count - 1];
        if (un->resident)
            continue;
        un->reread_s = (double)un->bytes / file_rate;
        double with = un->reread_s + un->transfer_s - prev->compute_s;
        double without = un->transfer_s - prev->compute_s;
        un->reread_stall_s = (with > 0.0 ? with : 0.0) - (without > 0.0 ? without : 0.0);
    }
    return true;
}

/* The retained units under budget by their re-read stall: those that stall most first
 * (greedy, skip on overflow), then the room left by `how` among those that do not stall.
 * *by_stall: whether any unit stalls at all (else this is `how` alone). */
static int choose_by_stall(const ddo_plan *p, const size_t *list, size_t count, uint64_t budget,
                           ddo_selection how, bool *flags, bool *by_stall)
{
    uint64_t *sizes = ddo__calloc(count ? count : 1, sizeof(*sizes));
    double *stall = ddo__calloc(count ? count : 1, sizeof(*stall));
    size_t *chosen = ddo__calloc(count ? count : 1, sizeof(*chosen));
    size_t *rest = ddo__calloc(count ? count : 1, sizeof(*rest));
    int rc = 0;
    if (sizes == NULL || stall == NULL || chosen == NULL || rest == NULL) {
        rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: unit selection");
        goto out;
    }
    *by_stall = false;
    for (size_t k = 0; k < count; k++) {
        sizes[k] = p->units[list[k]].bytes;
        stall[k] = p->units[list[k]].reread_stall_s;
        *by_stall = *by_stall || stall[k] > 0.0;
    }
    uint64_t taken = 0, more = 0;
    size_t n = ddo__select_by_cost(sizes, stall, count, budget, chosen, &taken);
    for (size_t k = 0; k < n; k++)
        flags[list[chosen[k]]] = true;
    size_t rn = 0;
    for (size_t k = 0; k < count; k++)
        if (!flags[list[k]])
            rest[rn++] = list[k];
    rc = choose_units(p, rest, rn, budget - taken, how, flags, &more);
out:
    free(sizes);
    free(stall);
    free(chosen);
    free(rest);
    return rc;
}

static uint64_t bytes_of(const ddo_plan *p, bool retained_only, bool registered_only)
{
    uint64_t s = 0;
    for (size_t u = 0; u < p->unit_count; u++) {
        const ddo__plan_unit *un = &p->units[u];
        if (un->resident || (retained_only && !un->retained) ||
            (registered_only && !un->registered))
            continue;
        s = ddo__sat_add_u64(s, un->bytes);
    }
    return s;
}

/* Host-memory tensors of registered units are registered in place (host_pins.h; the retained
 * store never copies them). Sums, over the streamed host tensors of the registered units (all
 * streamed units with all_units), their bytes and what the registered account takes for them
 * (their inner pages plus the pinned arena of their end fragments); skip_coded leaves out the
 * tensors weight_codec codes into ddo's own store (plan_codec.c). */
static void host_registered(const builder *b, bool all_units, bool residents, bool skip_coded,
                            uint64_t *bytes, uint64_t *pinned)
{
    const ddo_plan *p = b->p;
    *bytes = 0;
    *pinned = 0;
    ddo__host_range *r = ddo__calloc(b->n > 0 ? b->n : 1, sizeof(*r));
    size_t n = 0;
    for (size_t u = 0; u < p->unit_count; u++) {
        const ddo__plan_unit *un = &p->units[u];
        if (un->resident || !(un->registered || all_units))
            continue;
        for (size_t k = 0; k < un->tensor_count; k++) {
            size_t t = p->unit_tensors[un->first_tensor + k];
            const ddo_tensor_info *ti = b->ti[t];
            if (ti->file_index != UINT32_MAX || ti->host_data == NULL || ti->nbytes == 0 ||
                p->tensors[t].loc.placement != DDO_PLACEMENT_STREAMED ||
                (skip_coded && ddo__codec_codes_tensor(ti->dtype, ti->nbytes)))
                continue;
            *bytes = ddo__sat_add_u64(*bytes, ti->nbytes);
            if (r != NULL)
                r[n++] =
                    (ddo__host_range){ ti->host_data, ti->nbytes, u, p->tensors[t].loc.offset };
        }
    }
    for (size_t t = 0; residents && t < b->n; t++) {
        const ddo_tensor_info *ti = b->ti[t];
        if (p->tensors[t].loc.placement != DDO_PLACEMENT_RESIDENT || ti->host_data == NULL ||
            ti->nbytes == 0)
            continue;
        *bytes = ddo__sat_add_u64(*bytes, ti->nbytes);
        if (r != NULL) /* the resident arena: one more group */
            r[n++] = (ddo__host_range){ ti->host_data, ti->nbytes, p->unit_count,
                                        p->tensors[t].loc.offset };
    }
    /* Without the table (no memory), an upper bound: one more page per tensor. */
    *pinned =
        r != NULL ? ddo__host_pins_bytes(r, n) : ddo__sat_add_u64(*bytes, (uint64_t)b->n * 65536u);
    free(r);
}

uint64_t ddo__plan_host_pins_uncoded(const builder *b)
{
    bool residents = b->p->host_residents == DDO_HOST_RESIDENTS_REGISTERED;
    uint64_t bytes = 0, pinned = 0;
    host_registered(b, false, residents, true, &bytes, &pinned);
    return pinned;
}

/* True for a checkpoint of a caller's host tensors (one built for planning only, without
 * data, plans as the files it stands for). */
static bool holds_host_data(const builder *b)
{
    if (ddo_checkpoint_file_count(b->ck) > 0)
        return false;
    for (size_t t = 0; t < b->n; t++)
        if (b->ti[t]->host_data != NULL)
            return true;
    return false;
}

/* What the three steps of host_side share: the streamed units (list), a scratch flag per
 * unit, the selection rule and the route. */
typedef struct host_ctx {
    size_t *list;
    bool *flags;
    size_t streamed;
    ddo_selection how;
    bool vmm_fast, vmm_nvme;
    bool donor; /* the streamed units come from the store device (never the host's) */
} host_ctx;

/* A retained store smaller than the streamed units: by the re-read stall where the plan
 * prices it (reread_costs), else by pin_weight_selection; says which and what stays exposed. */
static int partial_store(builder *b, host_ctx *h, uint64_t retain_limit)
{
    ddo_plan *p = b->p;
    ddo__decisions *d = &p->decisions;
    bool priced = p->cost_enabled && b->in.file_read_bytes_per_s > 0.0, by_stall = false;
    int rc =
        priced ? choose_by_stall(p, h->list, h->streamed, retain_limit, h->how, h->flags, &by_stall)
               : choose_units(p, h->list, h->streamed, retain_limit, h->how, h->flags, NULL);
    if (rc != 0)
        return rc;
    double left = 0.0;
    for (size_t k = 0; k < h->streamed; k++) {
        ddo__plan_unit *un = &p->units[h->list[k]];
        un->retained = h->flags[h->list[k]];
        left += un->retained ? 0.0 : un->reread_stall_s;
    }
    p->retained_by_stall = by_stall;
    ddo__decisions_set_str(d, "retained_store", "partial");
    ddo__decisions_set_str(d, "retained_selection",
                           by_stall ? "stall" : ddo__selection_name(h->how));
    if (priced)
        ddo__decisions_set_num(d, "retained_stall_left_ms", left * 1e3);
    return 0;
}

/* The retained store: which streamed units keep their bytes in host RAM. */
static int retained_store(builder *b, host_ctx *h, uint64_t available)
{
    ddo_plan *p = b->p;
    const ddo__options *o = b->o;
    ddo__decisions *d = &p->decisions;
    uint64_t retain_limit = 0; /* 0: no limit */
    bool retain = true;
    if (h->vmm_nvme) {
        retain = false;
        ddo__decisions_set_str(d, "retained_store", "none_vmm_runtime");
    } else if (h->vmm_fast) {
        retain_limit = floor_to(ddo__gb_to_bytes(o->vmm_source_cache_gb), DDO_SEGMENT_BYTES);
        if (retain_limit == 0) {
            retain = false;
            ddo__decisions_set_str(d, "retained_store", "disabled");
        }
    } else if (available > 0) {
        /* The headroom stays the process's; the staging windows (at least two) come first. */
        uint64_t st =
            floor_to(ddo__gb_to_bytes(o->vmm_staging_buffer_gb), DDO_STAGING_WINDOW_BYTES);
        if (st < 2 * (uint64_t)DDO_STAGING_WINDOW_BYTES)
            st = 2 * (uint64_t)DDO_STAGING_WINDOW_BYTES;
        uint64_t hr = ddo__sat_add_u64(ddo__gb_to_bytes(o->system_ram_headroom_gb), st);
        retain_limit = floor_to(available > hr ? available - hr : 0, DDO_SEGMENT_BYTES);
        if (retain_limit == 0) {
            retain = false;
            ddo__decisions_set_str(d, "retained_store", "insufficient_ram");
        }
    }
    bool host_memory = holds_host_data(b);
    if (host_memory) {
        /* The caller's tensors are already in host RAM: nothing to retain, nothing to take. */
        for (size_t k = 0; k < h->streamed; k++)
            p->units[h->list[k]].retained = true;
        ddo__decisions_set_str(d, "retained_store", "host_memory");
    } else if (h->donor) {
        /* Donor mode: the store device holds every streamed unit, filled once from the file, and
         * each load, reload included, copies from there; a host copy would never be read. */
        ddo__decisions_set_str(d, "retained_store", "none_donor");
    } else if (retain) {
        uint64_t total = bytes_of(p, false, false);
        if (retain_limit == 0 || ddo__round_up(total, DDO_SEGMENT_BYTES) <= retain_limit) {
            for (size_t k = 0; k < h->streamed; k++)
                p->units[h->list[k]].retained = true;
            ddo__decisions_set_str(d, "retained_store", "all");
        } else {
            int rc = partial_store(b, h, retain_limit);
            if (rc != 0)
                return rc;
        }
    }
    p->budgets.retained_limit = retain_limit;
    p->budgets.retained_peak =
        host_memory ? 0 : ddo__round_up(bytes_of(p, true, false), DDO_SEGMENT_BYTES);
    return 0;
}

/* Windows (WDDM): pinned host memory comes from a pool of about half of RAM, so registration
 * is capped there (a tighter limit of the user's or the pin policy stays), with a note. */
static void wddm_pin_cap(builder *b, uint64_t *reg_limit, bool *partial)
{
    const ddo__platform *pf = b->pf;
    uint64_t cap = pf != NULL && pf->windows && !b->in.device_is_cpu
                       ? ddo__wddm_pin_cap(pf->ram_total_bytes)
                       : 0;
    if (cap == 0 || (*reg_limit > 0 && *reg_limit <= cap))
        return;
    *reg_limit = cap;
    *partial = true;
    char c[32], r[32], note[224];
    snprintf(note, sizeof(note),
             "Windows (WDDM): registered host memory capped at %s, half of the %s of RAM (the "
             "driver's pinning pool; inside a loaded process it can be smaller)",
             ddo__format_bytes(cap, c, sizeof(c)),
             ddo__format_bytes(pf->ram_total_bytes, r, sizeof(r)));
    ddo__decisions_set_str(&b->p->decisions, "registration_note", note);
    ddo__decisions_set_gb(&b->p->decisions, "wddm_pin_cap_gb", cap);
}

/* Registration within the retained store. */
static int registration(builder *b, host_ctx *h, const ddo__pin_resolution *pin, bool pin_skipped)
{
    ddo_plan *p = b->p;
    ddo_plan_budgets *bg = &p->budgets;
    const char *reg = NULL;
    uint64_t reg_limit = 0;
    bool partial = false;
    if (h->vmm_nvme)
        reg = "none_vmm_runtime";
    else if (h->vmm_fast) {
        if (b->settings.running_on_wsl && b->settings.disable_pin_on_wsl)
            reg = "pin_disabled_on_wsl";
        else {
            reg_limit =
                floor_to(ddo__gb_to_bytes(b->o->vmm_source_registered_gb), DDO_SEGMENT_BYTES);
            partial = reg_limit > 0;
        }
    } else {
        if (!b->settings.requested_pin_cpu_memory)
            reg = "pin_cpu_memory_off";
        else if (!b->settings.effective_pin_cpu_memory)
            reg = "pin_disabled_on_wsl";
        else if (pin_skipped)
            reg = "skip_insufficient_ram";
        else if (pin->mode == DDO_PIN_MODE_LIMITED) {
            reg_limit = floor_to(pin->budget, DDO_SEGMENT_BYTES);
            partial = true;
        }
    }
    if (reg == NULL) {
        wddm_pin_cap(b, &reg_limit, &partial);
        size_t rn = 0;
        for (size_t k = 0; k < h->streamed; k++)
            if (p->units[h->list[k]].retained)
                h->list[rn++] = h->list[k];
        /* Host tensors take their arena's rounding on top of their bytes: keep room for it. */
        uint64_t hb = 0, hp = 0;
        host_registered(b, true, false, false, &hb, &hp);
        uint64_t fringe = hp > hb ? hp - hb : 0;
        if (partial && ddo__sat_add_u64(ddo__round_up(bytes_of(p, true, false), DDO_SEGMENT_BYTES),
                                        fringe) > reg_limit) {
            memset(h->flags, 0, p->unit_count * sizeof(*h->flags));
            int rc = choose_units(p, h->list, rn, reg_limit > fringe ? reg_limit - fringe : 0,
                                  h->how, h->flags, NULL);
            if (rc != 0)
                return rc;
            for (size_t k = 0; k < rn; k++)
                p->units[h->list[k]].registered = h->flags[h->list[k]];
            reg = "partial";
        } else {
            for (size_t k = 0; k < rn; k++)
                p->units[h->list[k]].registered = true;
            reg = rn > 0 ? "all_retained" : "nothing_retained";
        }
    }
    ddo__decisions_set_str(&p->decisions, "registration", reg);
    bg->registered_limit = reg_limit;
    uint64_t host_bytes = 0, host_pages = 0; /* pages: what registering them in place takes */
    host_registered(b, false, false, false, &host_bytes, &host_pages);
    /* A caller's resident tensors are registered in place too when every streamed byte is and
     * the limit allows (their setup upload and every reload then read them directly); else
     * they are uploaded through the bounce buffer. */
    uint64_t rb = 0, rp = 0;
    bool residents = holds_host_data(b) &&
                     (strcmp(reg, "all_retained") == 0 || strcmp(reg, "nothing_retained") == 0);
    if (residents) {
        host_registered(b, false, true, false, &rb, &rp);
        residents = reg_limit == 0 || rp <= reg_limit;
    }
    if (holds_host_data(b)) {
        p->host_residents =
            residents ? DDO_HOST_RESIDENTS_REGISTERED : DDO_HOST_RESIDENTS_BOUNCE_BUFFER;
        ddo__decisions_set_str(&p->decisions, "host_residents",
                               residents ? "registered_in_place" : "bounce_buffer");
    }
    bg->registered_peak = ddo__round_up(bytes_of(p, false, true) - host_bytes, DDO_SEGMENT_BYTES);
    if (bg->registered_peak > bg->retained_peak)
        bg->registered_peak = bg->retained_peak;
    bg->registered_peak = ddo__sat_add_u64(bg->registered_peak, residents ? rp : host_pages);
    return 0;
}

/* Staging: whatever streams and is not registered travels through pinned windows. A retained
 * store the machine cannot hold is refused (the linear route sizes itself). */
static int staging(builder *b, const host_ctx *h, uint64_t available)
{
    ddo_plan *p = b->p;
    ddo_plan_budgets *bg = &p->budgets;
    uint64_t staging_bytes =
        floor_to(ddo__gb_to_bytes(b->o->vmm_staging_buffer_gb), DDO_STAGING_WINDOW_BYTES);
    size_t windows = (size_t)(staging_bytes / DDO_STAGING_WINDOW_BYTES);
    bool staging_needed = false; /* (in donor mode no streamed unit travels through staging) */
    for (size_t u = 0; u < p->unit_count && !h->donor; u++)
        if (!p->units[u].resident && !p->units[u].registered)
            staging_needed = true;
    bg->staging_window_bytes = DDO_STAGING_WINDOW_BYTES;
    if (h->vmm_nvme && h->streamed > 0 && !h->donor) {
        if (windows < 1)
            windows = 1;
        bg->staging_windows = 2 * windows;
    } else if (staging_needed) {
        bg->staging_windows = windows < 2 ? 2 : windows;
    }
    bg->staging_peak = (uint64_t)bg->staging_windows * DDO_STAGING_WINDOW_BYTES;
    if (h->vmm_fast && available > 0 &&
        ddo__sat_add_u64(bg->retained_peak, bg->staging_peak) > available) {
        char b1[32], b2[32], b3[32], b4[32];
        return ddo__fail(
            NULL, DDO_E_BUDGET,
            "retained host needs %s (retained %s + staging %s) but %s of RAM are "
            "available; lower vmm_source_cache_gb",
            ddo__format_gib(ddo__sat_add_u64(bg->retained_peak, bg->staging_peak), b1, sizeof(b1)),
            ddo__format_gib(bg->retained_peak, b2, sizeof(b2)),
            ddo__format_gib(bg->staging_peak, b3, sizeof(b3)),
            ddo__format_gib(available, b4, sizeof(b4)));
    }
    return 0;
}

/* The host budget in the decisions (what ddo's stores take of it and what they leave the
 * process), and the refusal of a cgroup limit below the smallest plan: streaming everything
 * through the staging windows, with the configured headroom kept for the process. Checked
 * here, before any store is allocated. */
static int host_budget(builder *b, uint64_t available)
{
    ddo_plan *p = b->p;
    ddo__decisions *d = &p->decisions;
    const ddo_plan_budgets *bg = &p->budgets;
    uint64_t headroom = ddo__gb_to_bytes(b->o->system_ram_headroom_gb);
    bool host_memory = holds_host_data(b);
    uint64_t stores = ddo__sat_add_u64(host_memory ? 0 : bg->retained_peak, bg->staging_peak);
    if (available > 0) {
        ddo__decisions_set_gb(d, "host_budget_gb", available);
        ddo__decisions_set_gb(d, "host_stores_gb", stores);
        ddo__decisions_set_gb(d, "host_left_for_process_gb",
                              available > stores ? available - stores : 0);
    }
    uint64_t cg = ddo__os_cgroup_memory_limit();
    uint64_t need = ddo__sat_add_u64(bg->staging_peak, headroom);
    if (cg == 0 || host_memory || cg >= need)
        return 0;
    char b1[32], b2[32], b3[32], b4[32];
    return ddo__fail(NULL, DDO_E_BUDGET,
                     "the cgroup memory limit %s is below what the smallest plan needs: %s "
                     "(staging %s + system_ram_headroom_gb %s); raise the limit or lower "
                     "system_ram_headroom_gb",
                     ddo__format_gib(cg, b1, sizeof(b1)), ddo__format_gib(need, b2, sizeof(b2)),
                     ddo__format_gib(bg->staging_peak, b3, sizeof(b3)),
                     ddo__format_gib(headroom, b4, sizeof(b4)));
}

/* Retained store, registration and staging for the route. */
int ddo__plan_host_side(builder *b, uint64_t available, const ddo__pin_resolution *pin,
                        bool pin_skipped)
{
    ddo_plan *p = b->p;
    const ddo__options *o = b->o;
    host_ctx h;
    memset(&h, 0, sizeof(h));
    h.vmm_fast = p->route == DDO__ROUTE_VMM_FAST;
    h.vmm_nvme = p->route == DDO__ROUTE_VMM_RUNTIME;
    h.donor = ddo__plan_devset_donor(o);
    h.how = DDO_SELECTION_SPREAD;
    if (!ddo__selection_from_name(o->pin_weight_selection, &h.how) || h.how == DDO_SELECTION_COST)
        return ddo__fail(NULL, DDO_E_CONFIG,
                         "pin_weight_selection: \"%s\" is not one of first, spread, largest",
                         o->pin_weight_selection ? o->pin_weight_selection : "");
    h.list = ddo__calloc(p->unit_count ? p->unit_count : 1, sizeof(*h.list));
    h.flags = ddo__calloc(p->unit_count ? p->unit_count : 1, sizeof(*h.flags));
    int rc = 0;
    if (h.list == NULL || h.flags == NULL) {
        rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: retained store");
        goto out;
    }
    for (size_t u = 0; u < p->unit_count; u++)
        if (!p->units[u].resident)
            h.list[h.streamed++] = u;
    if (!holds_host_data(b))
        (void)reread_costs(p, b->in.file_read_bytes_per_s);
    if ((rc = retained_store(b, &h, available)) == 0 &&
        (rc = registration(b, &h, pin, pin_skipped)) == 0 && (rc = staging(b, &h, available)) == 0)
        rc = host_budget(b, available);
out:
    free(h.list);
    free(h.flags);
    return rc;
}
