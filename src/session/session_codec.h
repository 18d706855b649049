/*
 * session_codec.h - the coded transport and its decode memory (session_codec.c): what the
 * session calls at setup, with its device state, around each unit's uploads, when a load is
 * first leased and at teardown. Internal; never installed.
 */
#ifndef DDO_SESSION_CODEC_H
#define DDO_SESSION_CODEC_H

#include "session/session.h"

struct ddo__transport;
struct ddo__upload;

/* True when the plan decided weight_codec=ddoc1 (the store codes its tensors). */
bool ddo__session_codec_wanted(const ddo_session *s);
/* After the store is built: sizes the decode areas and the slots' status parts from the coded
 * store and creates the decode stream and its events. DDO_E_UNSUPPORTED (one line) when the
 * plan codes and the device has no decoder. No-op without the codec. */
int ddo__session_codec_create(ddo_session *s);
void ddo__session_codec_destroy(ddo_session *s);
/* Allocates / frees the decode memory with the other device state (device weights account). */
int ddo__session_codec_back(ddo_session *s);
int ddo__session_codec_unback(ddo_session *s);
/* The stream a unit's upload event is recorded on: the decode stream when the session decodes
 * (it has joined the copy stream's work by then, ddo__session_codec_finish), else NULL. */
void *ddo__session_codec_stream(const ddo_session *s);
/* Waits for the decode stream (no-op without one). */
int ddo__session_codec_sync(ddo_session *s);
/* The loader, before a unit's first upload into slot: the slot's decodes start afresh. */
void ddo__session_codec_begin(ddo_session *s, size_t slot);
/* The coded row's upload: coded bytes into the open batch's decode area (copy stream); the
 * batch's one decode into each tensor's up->dst (decode stream, after its uploads) is queued
 * when the next tensor would not fit the area, or by ddo__session_codec_finish. */
int ddo__transport_coded(ddo_session *s, const struct ddo__transport *t,
                         const struct ddo__upload *up, ddo__errbuf *eb);
/* The coded_file row's upload (a file tensor with a sidecar stream): the stream is read into a
 * staging window (ddo__source_read_coded: identity, hash, plan), uploaded into the open
 * batch's decode area and decoded as in the coded row. A stream that is unusable (its hash,
 * its read, its plan) is a note and a count (codec_stream_fallbacks), and the tensor is read
 * raw from the checkpoint, this load and every later one; one that does not fit a window or
 * the decode area is read raw without a note. */
int ddo__transport_coded_file(ddo_session *s, const struct ddo__transport *t,
                              const struct ddo__upload *up, ddo__errbuf *eb);
/* True when tensor (a file tensor) goes by coded_file. */
bool ddo__session_codec_streams(const ddo_session *s, size_t tensor);
/* The first coded_file fallback's note ("" when none). */
const char *ddo__session_codec_stream_note(const ddo_session *s);
/* After a unit's last tensor was queued: when ok, the unit's last batch is decoded, the
 * decode stream joins the copy stream and copies the slot's status part to its pinned host
 * copy, and the slot's decodes are due for ddo__session_codec_verify; else (or when one of
 * those fails) they are forgotten (the loader waits for both streams itself). */
int ddo__session_codec_finish(ddo_session *s, bool ok, ddo__errbuf *eb);
/* True when slot's last load decoded tensors not verified yet (the host, mu held). */
bool ddo__session_codec_due(const ddo_session *s, size_t slot);
/* The host, before slot's load is first leased (mu not held): waits for its upload event
 * (which follows the status copy) and checks every decode of the load in the slot's pinned
 * status copy (DDO_E_FORMAT naming the tensor and block). The decodes are no longer due afterwards,
 * either way; *unsafe when nothing says the slot's decodes have finished (the wait failed twice).
 */
int ddo__session_codec_verify(ddo_session *s, size_t slot, bool *unsafe, ddo__errbuf *eb);

/* Tests: caps the decode areas at bytes (0: DDO_CODEC_AREA_CAP) for sessions created after
 * the call, so a small unit splits into several batches. */
void ddo__session_codec_test_area_cap(uint64_t bytes);

/* Tests: sidecar streams (coded_file) longer than bytes are read in pieces of at most bytes
 * (0: the staging window's), for the sessions' loads after the call: the way a stream longer
 * than the 32 MiB window (a full-size tensor) goes, at the scale of a test. */
void ddo__session_codec_test_piece_cap(uint64_t bytes);

#endif /* DDO_SESSION_CODEC_H */
