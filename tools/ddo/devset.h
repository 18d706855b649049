/*
 * devset.h - a plan's device set as the tool's commands open it (docs/multi-gpu.md): the
 * devices the set names after the first, opened once and handed to each session (donor mode:
 * the second device as the store; split mode: every device after the first), and the split
 * check that compares a tensor's bytes on every device with the first device's.
 */
#ifndef DDO_TOOL_DEVSET_H
#define DDO_TOOL_DEVSET_H

#include "ddo.h"

#include <stddef.h>
#include <stdint.h>

#define TOOL_DEVSET_MAX 15

typedef struct tool_devset {
    ddo_device_mode mode; /* the mode its devices were opened for; SINGLE while none are */
    ddo_device *dev[TOOL_DEVSET_MAX];
    size_t count;
    char names[256]; /* the opened devices' specs, comma-separated */
} tool_devset;

/* Opens the devices of plan's set after the first, unless d holds them already for that mode
 * (held for the other mode, they are closed first); nothing for a single-device plan. 0, or a ddo
 * error code with ddo_last_error() ("store device: ...", "split device: ..." in what the caller
 * prints). */
int tool_devset_open(tool_devset *d, const ddo_plan *plan);
/* The devices a session of plan takes (store_device, split_devices) into so; none where plan
 * is not of d's mode, so a single-device case of the same command runs alone. */
void tool_devset_session(const tool_devset *d, const ddo_plan *plan, ddo_session_options *so);
/* Whether plan is a split plan whose devices d holds (the split checks apply). */
int tool_devset_split(const tool_devset *d, const ddo_plan *plan);
/* Destroys the devices (after every session that used them). */
void tool_devset_close(tool_devset *d);

/* Tensor t as each of split_count other devices holds it, read back, against the first
 * device's bytes (the unit's upload complete first): adds to *checked and *differ. 0 or a ddo
 * error code (the session's error says why). */
int tool_devset_compare(ddo_session *s, const ddo_checkpoint *ck, size_t t, size_t split_count,
                        uint64_t *checked, uint64_t *differ);

#endif /* DDO_TOOL_DEVSET_H */
