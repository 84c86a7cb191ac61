/* zps_outbox.c - the coordinator's queue of messages to send. */
#include "zps_outbox.h"

#include <stdlib.h>
#include <string.h>

#include "common/zps_log.h"
#include "common/zps_wire.h"

void zps_outbox_init(zps_outbox *o)
{
    *o = (zps_outbox){0};
}

void zps_outbox_clear(zps_outbox *o)
{
    for (size_t i = 0; i < o->n; i++) {
        zps_wire_route_close(&o->msgs[i].route);
        free(o->msgs[i].hdr);
    }
    o->n = 0;
}

void zps_outbox_fini(zps_outbox *o)
{
    zps_outbox_clear(o);
    free(o->msgs);
    *o = (zps_outbox){0};
}

static zps_err s_dropped(zps_outbox *o, const Zps__Header *h)
{
    o->dropped++;
    zps_log_error("out of memory: a %s was not sent", zps_wire_type_name((int)h->type));
    return ZPS_ENOMEM;
}

zps_err zps_outbox_add(zps_outbox *o, zmq_msg_t *route, const Zps__Header *h)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 16;
        zps_outbox_msg *msgs = realloc(o->msgs, cap * sizeof *msgs);
        if (!msgs) {
            return s_dropped(o, h);
        }
        o->msgs = msgs;
        o->cap = cap;
    }
    zps_outbox_msg *m = &o->msgs[o->n];
    m->len = zps__header__get_packed_size(h);
    if (!(m->hdr = malloc(m->len ? m->len : 1))) {
        return s_dropped(o, h);
    }
    zps__header__pack(h, m->hdr);
    zps_wire_route_copy(&m->route, route);
    o->n++;
    return ZPS_OK;
}

zps_err zps_outbox_add_error(zps_outbox *o, zmq_msg_t *route, uint64_t job_id, uint64_t step,
                             zps_err code, const char *why)
{
    Zps__Header h;
    zps_wire_error_header(&h, job_id, step, code, why);
    return zps_outbox_add(o, route, &h);
}

zps_err zps_outbox_flush(zps_outbox *o, void *sock)
{
    zps_err first = ZPS_OK;
    for (size_t i = 0; i < o->n; i++) {
        zps_outbox_msg *m = &o->msgs[i];
        zps_err err = zps_wire_send_packed(sock, &m->route, m->hdr, m->len);
        first = first == ZPS_OK ? err : first;
    }
    zps_outbox_clear(o);
    return first;
}

Zps__Header *zps_outbox_header(const zps_outbox *o, size_t i)
{
    return i < o->n ? zps__header__unpack(NULL, o->msgs[i].len, o->msgs[i].hdr) : NULL;
}
