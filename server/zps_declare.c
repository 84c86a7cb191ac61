/* zps_declare.c - shard 0 of --model external: the first worker's HELLO
 * declares the model (its layout) and the dataset's sizes; the job starts
 * from it, and it is kept beside the checkpoints so that a coordinator
 * restarted with --resume knows the model before any worker is back.
 * Until then every other message is "not yet". */
#include "server/zps_server_int.h"

#include <errno.h>
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_groups.h"
#include "common/zps_layout.h"
#include "common/zps_ckpt.h"

// Where the first declaration is kept (ZPS_CKPT_DECLARED), so that a
// coordinator restarted with --resume knows the model before any worker is
// back, and a reader of the checkpoints (zps_checkpoint_open) names them.
#define ZPS_SERVER_DECLARED ZPS_CKPT_DECLARED
#define ZPS_SERVER_DECLARED_MAX ZPS_CKPT_DECLARED_MAX

static const char *s_schedule_name(zps_lr_schedule s)
{
    static const char *const names[] = {"constant", "cosine", "linear", "step"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "?";
}

// The declared optimizer against the flags: a server given optimizer
// flags takes the groups only when they are its flags, and a table only
// without schedule flags (the flags are the job's; the refusal names the
// first difference). A diloco job's shards run the outer step alone: the
// groups a worker declares there are its inner optimizer's (zps.torch
// declares its optimizer before it knows the job's mode), and are not the
// shards' business; buffers and a table have no meaning there.
static bool s_optimizer_ok(const zps_server *srv, const Zps__Hello *hello, char *why,
                           size_t len)
{
    const zps_server_opts *o = srv->o;
    if (o->mode.diloco) {
        bool buffers = false;
        for (size_t i = 0; i < hello->layout->n_tensors; i++) {
            buffers = buffers || hello->layout->tensors[i]->role != ZPS_ROLE_PARAM;
        }
        if (buffers || hello->declares_schedule) {
            snprintf(why, len, "a diloco job's shards take one outer step for all: declare no "
                               "buffers (zps.torch: buffers='local') or learning-rate table "
                               "(step the scheduler yourself)");
            return false;
        }
        return true;
    }
    if (o->optim_given && zps_groups_differ_flags(hello->layout, &o->optim, why, len)) {
        return false;
    }
    if (hello->declares_schedule && o->schedule_given) {
        snprintf(why, len, "this job's schedule is the server's (--lr %g, --lr-schedule %s, "
                           "--warmup-steps %llu): drop the scheduler or start zps-server without "
                           "optimizer flags", o->optim.lr, s_schedule_name(o->optim.schedule),
                 (unsigned long long)o->optim.warmup_steps);
        return false;
    }
    return true;
}

// --deterministic: buffers (BatchNorm's running statistics) are each
// worker's own update over its samples in its order, so a run's bits would
// follow the split; a layout with one is refused.
static bool s_deterministic_ok(const zps_server *srv, const Zps__Hello *hello, char *why,
                               size_t len)
{
    for (size_t i = 0; srv->o->micro_batch && i < hello->layout->n_tensors; i++) {
        if (hello->layout->tensors[i]->role != ZPS_ROLE_PARAM) {
            snprintf(why, len, "--deterministic takes no buffers (%s): their running "
                               "statistics would follow the split", hello->layout->tensors[i]->name);
            return false;
        }
    }
    return true;
}

// A declaration (the HELLO part: layout, dataset sizes) the job can take;
// why says what is wrong with it.
static bool s_declaration_ok(const zps_server *srv, const Zps__Hello *hello, char *why,
                             size_t len)
{
    if (!hello || !hello->layout) {
        snprintf(why, len, "this job's model is declared by its workers (--model external): "
                           "this worker declared none");
        return false;
    }
    if (zps_layout_check(hello->layout, why, len) != ZPS_OK) {
        return false;
    }
    float clip = hello->layout->clip_grad_norm;
    if (!(clip >= 0.0f && clip <= FLT_MAX) ||
        (clip > 0.0f && srv->o->clip_grad_norm > 0.0f && clip != srv->o->clip_grad_norm)) {
        snprintf(why, len, "declared clip_grad_norm %g; this server's --clip-grad-norm is %g",
                 (double)clip, (double)srv->o->clip_grad_norm);
        return false;
    }
    if (!s_optimizer_ok(srv, hello, why, len) || !s_deterministic_ok(srv, hello, why, len)) {
        return false;
    }
    if (hello->n_train == 0 || (srv->size_train && hello->n_train != srv->size_train)) {
        snprintf(why, len, "declared %u train records; the job's --dataset is size:%u",
                 hello->n_train, srv->size_train);
        if (!srv->size_train) {
            snprintf(why, len, "declare the dataset's size: train records (and test records)");
        }
        return false;
    }
    return true;
}

// The job's model and dataset sizes from a declaration, then the rest of
// shard 0's start. Nothing stays set when it fails.
static int s_take_declaration(zps_server *srv, const Zps__Hello *hello, char *why, size_t len)
{
    Zps__Hello copy = ZPS__HELLO__INIT; // what is kept: the declaration, not the host
    copy.layout = hello->layout;
    copy.n_train = hello->n_train;
    copy.n_test = hello->n_test;
    size_t n = zps__hello__get_packed_size(&copy);
    uint8_t *buf = n <= ZPS_SERVER_DECLARED_MAX ? malloc(n ? n : 1) : NULL;
    if (!buf) {
        snprintf(why, len, "a declaration of %zu bytes is more than this server keeps", n);
        return 2;
    }
    zps__hello__pack(&copy, buf);
    srv->declared = zps__hello__unpack(NULL, n, buf);
    int status = 1;
    snprintf(why, len, "out of memory");
    if (srv->declared) {
        zps_layout_model(srv->declared->layout, &srv->model);
        snprintf(srv->dataset, sizeof srv->dataset, "size:%u", hello->n_train);
        status = zps_start_coordinator(srv, hello->n_train, hello->n_test, why, len);
    }
    if (status == 0 && srv->o->checkpoint_dir &&
        zps_ckpt_write_record(srv->o->checkpoint_dir, ZPS_SERVER_DECLARED, buf, n) != ZPS_OK) {
        zps_log_warn("could not keep the declared model in %s: a restart with --resume will "
                     "wait for a worker to declare it again", srv->o->checkpoint_dir);
    }
    free(buf);
    if (status != 0 && srv->declared) {
        zps__hello__free_unpacked(srv->declared, NULL);
        srv->declared = NULL;
    }
    return status;
}

// --resume of an external job: the declaration kept by the first start,
// if there is one. ZPS_ENOENT: none (the first worker declares it).
zps_err zps_declare_load(zps_server *srv, char *why, size_t len)
{
    uint8_t *buf = malloc(ZPS_SERVER_DECLARED_MAX);
    size_t n = 0;
    zps_err err = buf ? zps_ckpt_read_record(srv->o->checkpoint_dir, ZPS_SERVER_DECLARED, buf,
                                             ZPS_SERVER_DECLARED_MAX, &n)
                      : ZPS_ENOMEM;
    Zps__Hello *hello = err == ZPS_OK ? zps__hello__unpack(NULL, n, buf) : NULL;
    free(buf);
    if (err == ZPS_OK && (!hello || !s_declaration_ok(srv, hello, why, len))) {
        zps_log_error("%s/%s: not a usable declared model", srv->o->checkpoint_dir,
                      ZPS_SERVER_DECLARED);
        err = ZPS_EPROTO;
    }
    if (err == ZPS_OK && s_take_declaration(srv, hello, why, len) != 0) {
        err = ZPS_EINVAL;
    }
    if (hello) {
        zps__hello__free_unpacked(hello, NULL);
    }
    return err;
}

// Shard 0 of an external job before its model is declared: the first
// worker's HELLO declares it, and the coordinator starts (ZPS_OK: the loop
// then hands it the HELLO like any other). Until then everything else is
// "not yet": the error and *why are what the loop refuses m with.
zps_err zps_declare_on_undeclared(zps_server *srv, const zps_wire_msg *m, char *why, size_t len)
{
    if (m->hdr->type != ZPS__MSG_TYPE__HELLO) {
        snprintf(why, len, "waiting for the first worker to declare the model");
        return ZPS_EAGAIN;
    }
    if (!s_declaration_ok(srv, m->hdr->hello, why, len)) {
        return ZPS_EINVAL;
    }
    if (s_take_declaration(srv, m->hdr->hello, why, len) != 0) {
        zps_log_error("the model declared by %s does not fit this job: %s",
                      m->hdr->hello->host ? m->hdr->hello->host : "?", why);
        return ZPS_EINVAL;
    }
    zps_log_info("model declared by %s: %zu tensors, %zu parameters in %d buckets (%s)",
                 m->hdr->hello->host ? m->hdr->hello->host : "?",
                 srv->declared->layout->n_tensors, srv->model.n_params,
                 zps_model_n_buckets(&srv->model), srv->model.text);
    return ZPS_OK;
}

// --dataset size:N of an external model: N train records, 1..2^32-1.
zps_err zps_declare_parse_size(const char *text, uint32_t *n)
{
    char *end;
    errno = 0;
    unsigned long long v = strncmp(text, "size:", 5) == 0 && text[5] >= '0' && text[5] <= '9'
                               ? strtoull(text + 5, &end, 10)
                               : 0;
    if (v == 0 || v > UINT32_MAX || errno || *end) {
        return ZPS_EINVAL;
    }
    *n = (uint32_t)v;
    return ZPS_OK;
}
