/* zps_host_code.c - one push per host (lib/zps_host.h) with --wire-code
 * zstd: the leader codes each push it sends a shard elsewhere (byte
 * planes and zstd, common/zps_zcode.h) and says which step's parameters
 * of that shard's range it holds as received; the shard answers with the
 * next step's XORed with them, which the leader decodes here before it
 * passes them on or takes them. Nothing here changes a value: a frame
 * that does not decode to the bits it was coded from (its hash) is
 * dropped and the bucket asked for again uncoded. */
#include "lib/zps_host_int.h"

#include <stdlib.h>
#include <string.h>

#include "common/zps_log.h"
#include "common/zps_wirecode.h"

void zps_host_code_fini(zps_host *h)
{
    if (h->coded_out || h->coded_in) {
        zps_log_info("wire code: %llu pushes coded, %llu buckets of parameters decoded against "
                     "the step before", (unsigned long long)h->coded_out,
                     (unsigned long long)h->coded_in);
    }
    h->coded_out = h->coded_in = 0;
    zps_zcode_destroy(&h->code);
    free(h->code_vals);
    h->code_vals = NULL;
    for (int i = 0; i < ZPS_CONN_MAX_SHARDS; i++) {
        free(h->code_steps[i]);
        h->code_steps[i] = NULL;
    }
}

// The coder, the copy of the parameters and shard i's steps, made at
// first use; false (logged) without memory: the job goes on uncoded.
static bool s_ready(zps_client *c, int i)
{
    zps_host *h = &c->host;
    if (!h->code && zps_zcode_new(&h->code) != ZPS_OK) {
        return false;
    }
    // Zeroed: no page is written before its bucket is kept.
    if (!h->code_vals && !(h->code_vals = calloc(c->model.n_params, sizeof(float)))) {
        zps_log_error("out of memory for the parameters the wire's code is against");
        return false;
    }
    int nb = c->conn.shards[i].n_buckets;
    if (!h->code_steps[i] && !(h->code_steps[i] = calloc((size_t)nb, sizeof(uint64_t)))) {
        zps_log_error("out of memory for the parameters the wire's code is against");
        return false;
    }
    return true;
}

// Shard i's buckets in the copy are of no step from now on, and the next
// push to it says so (even a step's later one, or one of a step done over).
static void s_forget(zps_client *c, int i)
{
    if (c->host.code_steps[i]) {
        memset(c->host.code_steps[i], 0, (size_t)c->conn.shards[i].n_buckets * sizeof(uint64_t));
    }
    c->host.code_step[i] = 0;
}

void zps_host_code_forget(zps_client *c)
{
    for (int i = 0; i < c->conn.n_shards; i++) {
        s_forget(c, i);
    }
}

// 1 + the step whose parameters of shard i's whole range code_vals holds
// (0: none, or not all of one step).
static uint64_t s_base_step(const zps_client *c, int i)
{
    const uint64_t *steps = c->host.code_steps[i];
    if (!steps) {
        return 0;
    }
    for (int b = 1; b < c->conn.shards[i].n_buckets; b++) {
        if (steps[b] != steps[0]) {
            return 0;
        }
    }
    return steps[0];
}

void zps_host_code_push(zps_client *c, int i, Zps__Header *hd, zps_wire_msg *out)
{
    zps_host *h = &c->host;
    if (!h->codes || c->dtype != ZPS_DTYPE_F32 || !s_ready(c, i) ||
        zps_wirecode_encode(h->code, out, NULL) != ZPS_OK) {
        return; // as it is: the shard takes uncoded pushes too
    }
    out->payload_bytes = 0;
    for (int f = 0; f < out->n_frames; f++) {
        out->payload_bytes += zmq_msg_size(&out->frames[f]);
    }
    // What the copy holds at the step's first push: the answers to its
    // first buckets may come before its last ones go, and move the copy
    // of those buckets on a step.
    if (h->code_step[i] != hd->step + 1) {
        h->code_step[i] = hd->step + 1;
        h->code_base[i] = s_base_step(c, i);
    }
    hd->wire_code = ZPS_ZCODE_PLANES;
    hd->code_base = h->code_base[i];
    h->coded_out++;
}

// m's values (checked: bucket b of shard i, fp32 frames) kept as those
// code_vals holds of step m's step, unless it holds a later one.
static void s_keep(zps_client *c, int i, int b, const zps_wire_msg *m)
{
    if (c->host.code_steps[i][b] > m->hdr->step + 1) {
        return; // a late second answer of a step before
    }
    float *at = c->host.code_vals + m->hdr->offset;
    for (int f = 0; f < m->n_frames; f++) {
        size_t len = zmq_msg_size((zmq_msg_t *)&m->frames[f]);
        memcpy(at, zmq_msg_data((zmq_msg_t *)&m->frames[f]), len);
        at += len / sizeof(float);
    }
    c->host.code_steps[i][b] = m->hdr->step + 1;
}

// Decodes m (coded, bucket b of shard i); the reason in why if it cannot.
static void s_decode(zps_client *c, int i, int b, zps_wire_msg *m, char *why, size_t why_len)
{
    zps_host *h = &c->host;
    const Zps__Header *hd = m->hdr;
    bool xor = hd->wire_code == ZPS_ZCODE_XOR;
    if (!s_ready(c, i)) {
        snprintf(why, why_len, "no memory to decode them");
    } else if (xor && (hd->code_base == 0 || h->code_steps[i][b] != hd->code_base)) {
        snprintf(why, why_len, "XORed with step %llu's values, this worker holds %s",
                 (unsigned long long)(hd->code_base ? hd->code_base - 1 : 0),
                 h->code_steps[i][b] ? "another step's" : "none");
    } else if (zps_wirecode_decode(h->code, m, h->code_vals + hd->offset, hd->count, why,
                                   why_len) == ZPS_OK && xor) {
        h->coded_in++;
    }
}

bool zps_host_code_take(zps_client *c, int i, zps_wire_msg *m, uint64_t step)
{
    zps_host *h = &c->host;
    const Zps__Header *hd = m->hdr;
    if (!hd || hd->type != ZPS__MSG_TYPE__PARAMS || hd->shm_size > 0) {
        return true;
    }
    if (hd->wire_code == ZPS_ZCODE_NONE && !(h->codes && zps_host_leads(c) && h->remote[i])) {
        s_forget(c, i); // not kept up while not leading: no base from now on
        return true;
    }
    zps_conn_shard *sc = &c->conn.shards[i];
    int b = zps_conn_bucket_of(sc, hd->offset, hd->offset + hd->count);
    char why[200] = "";
    if (b < 0) {
        snprintf(why, sizeof why, "[%llu, +%llu) is not one of its buckets",
                 (unsigned long long)hd->offset, (unsigned long long)hd->count);
    } else if (hd->wire_code != ZPS_ZCODE_NONE) {
        s_decode(c, i, b, m, why, sizeof why);
    }
    if (!why[0] && s_ready(c, i) &&
        zps_wire_check_tensor(m, ZPS_DTYPE_F32, sc->lo, sc->hi, why, sizeof why) == ZPS_OK) {
        s_keep(c, i, b, m);
        return true;
    }
    if (hd->wire_code == ZPS_ZCODE_NONE) {
        return true; // not kept: the wait judges it as it is
    }
    // The copy of this shard's range is not what its shard holds: every
    // later answer of it would fail too. Asked for again uncoded, once.
    s_forget(c, i);
    if (h->code_pulled[i] != hd->step + 1 || hd->step != step) {
        zps_log_warn("%s's coded parameters of step %llu not decoded (%s): asked for again "
                     "uncoded", sc->endpoint, (unsigned long long)hd->step, why);
    }
    return false;
}
