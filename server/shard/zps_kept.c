/* zps_kept.c - a bucket's first push, kept (zps_kept.h). */
#include "server/shard/zps_kept.h"

#include <stdlib.h>

#include "common/zps_log.h"

bool zps_kept_take(zps_kept *k, const zps_wire_msg *m, float weight)
{
    ZPS_ASSERT(!k->frames && m->n_frames > 0);
    k->frames = malloc((size_t)m->n_frames * sizeof *k->frames);
    if (!k->frames) {
        return false;
    }
    for (int f = 0; f < m->n_frames; f++) {
        // A copy shares the bytes: a reference count, or for a view the
        // same pointer and free function.
        ZPS_ASSERT(zmq_msg_init(&k->frames[f]) == 0);
        ZPS_ASSERT(zmq_msg_copy(&k->frames[f], (zmq_msg_t *)&m->frames[f]) == 0);
    }
    k->n_frames = m->n_frames;
    k->weight = weight;
    return true;
}

bool zps_kept_has(const zps_kept *k)
{
    return k->frames != NULL;
}

void zps_kept_drop(zps_kept *k)
{
    for (int f = 0; f < k->n_frames; f++) {
        (void)zmq_msg_close(&k->frames[f]);
    }
    free(k->frames);
    *k = (zps_kept){0};
}
