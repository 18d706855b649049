/*
 * session_codec.h - the coded transport and its decode area (session_codec.c): what the
 * session calls at setup, with its device state, after each unit's uploads and at teardown.
 * Internal; never installed.
 */
#ifndef DDO_SESSION_CODEC_H
#define DDO_SESSION_CODEC_H

#include "session.h"

struct ddo__transport;
struct ddo__upload;

/* True when the plan decided weight_codec=ddoc1 (the store codes its tensors). */
bool ddo__session_codec_wanted(const ddo_session *s);
/* After the store is built: sizes the decode area from the coded store. DDO_E_UNSUPPORTED
 * (one line) when the plan codes and the device has no decoder. No-op without the codec. */
int ddo__session_codec_create(ddo_session *s);
void ddo__session_codec_destroy(ddo_session *s);
/* Allocates / frees the decode area with the other device state (device weights account). */
int ddo__session_codec_back(ddo_session *s);
int ddo__session_codec_unback(ddo_session *s);
/* The coded row's upload: coded bytes into the area, then the decode into up->dst. */
int ddo__transport_coded(ddo_session *s, const struct ddo__transport *t,
                         const struct ddo__upload *up, ddo__errbuf *eb);
/* After a unit's last tensor was queued: with check, waits for the copy stream and checks
 * every coded tensor's status (DDO_E_FORMAT naming the tensor and block); forgets the unit's
 * decodes either way. */
int ddo__session_codec_finish(ddo_session *s, bool check, ddo__errbuf *eb);

#endif /* DDO_SESSION_CODEC_H */
