/* zps_optdecl.c - libzps: the optimizer a caller declares with its model
 * (1.4): parameter groups (torch's param_groups), each tensor's group,
 * buffers, and the learning-rate table of a scheduler rank 0 runs over the
 * job's steps. The shards apply them per tensor (docs/optimizers.md). */
#include "lib/zps_client_int.h"

#include <math.h>
#include <stdio.h>

#include "common/zps_groups.h"

zps_err zps_declare_group(zps_client *c, int group, int kind, double lr, double momentum,
                          int nesterov, double weight_decay, double beta1, double beta2,
                          double eps)
{
    zps_client_begin(c);
    if (c->joined) {
        return zps_client_einval(c, "parameter groups are declared before zps_join");
    }
    if (kind < ZPS_INNER_SGD || kind > ZPS_INNER_ADAMW) {
        return zps_client_einval(c, "group %d: kind %d, expected ZPS_INNER_SGD, _ADAM or _ADAMW",
                                 group, kind);
    }
    Zps__Optim g = ZPS__OPTIM__INIT;
    g.kind = (uint32_t)(kind - ZPS_INNER_SGD); // zps_optim_kind
    g.lr = (float)lr;
    g.momentum = (float)momentum;
    g.nesterov = nesterov != 0;
    g.weight_decay = (float)weight_decay;
    g.beta1 = beta1;
    g.beta2 = beta2;
    g.eps = eps;
    Zps__Layout one = ZPS__LAYOUT__INIT; // the group alone, checked as the server will
    Zps__Optim *ptr = &g;
    one.groups = &ptr;
    one.n_groups = 1;
    char why[256];
    if (zps_groups_check(&one, why, sizeof why) != ZPS_OK) {
        return zps_client_einval(c, "group %d%s", group, why + 7); // "group 0" -> "group N"
    }
    zps_err err = zps_decl_group(&c->decl, group, &g, why, sizeof why);
    if (err == ZPS_EINVAL) {
        return zps_client_einval(c, "%s", why);
    }
    return err == ZPS_OK ? ZPS_OK : zps_client_fail(c, err);
}

// A declared tensor's group or role, before zps_join.
static zps_err s_tensor_is(zps_client *c, const char *name, int group, int role)
{
    if (c->joined) {
        return zps_client_einval(c, "a tensor's group or role is declared before zps_join");
    }
    char why[256];
    if (zps_decl_tensor_is(&c->decl, name, group, role, why, sizeof why) != ZPS_OK) {
        return zps_client_einval(c, "%s", why);
    }
    return ZPS_OK;
}

zps_err zps_declare_tensor_group(zps_client *c, const char *name, int group)
{
    zps_client_begin(c);
    return s_tensor_is(c, name, group, ZPS_ROLE_PARAM);
}

zps_err zps_declare_buffer(zps_client *c, const char *name, int ndim, const int64_t *shape,
                           int how)
{
    zps_client_begin(c);
    if (how != ZPS_BUFFER_AVERAGE && how != ZPS_BUFFER_BROADCAST) {
        return zps_client_einval(c, "buffer '%s': how %d, expected ZPS_BUFFER_AVERAGE or "
                                    "ZPS_BUFFER_BROADCAST", name ? name : "(null)", how);
    }
    zps_err err = zps_declare_tensor(c, name, ndim, shape);
    if (err != ZPS_OK) {
        return err;
    }
    _Static_assert(ZPS_BUFFER_AVERAGE == (int)ZPS_ROLE_AVERAGE &&
                       ZPS_BUFFER_BROADCAST == (int)ZPS_ROLE_BROADCAST,
                   "buffer kinds are the wire's roles");
    return s_tensor_is(c, name, 0, how);
}

zps_err zps_declare_lr_table(zps_client *c, int groups, uint64_t steps, const float *lr)
{
    zps_client_begin(c);
    if (!c->joined && steps == 0 && !lr) {
        c->decl.announces_table = true; // the HELLO says one comes
        return ZPS_OK;
    }
    if (!c->joined || c->phase != ZPS_PHASE_NEW) {
        return zps_client_einval(c, "a learning-rate table is declared after zps_join and "
                                    "before the first zps_next_work");
    }
    if (!c->decl.announces_table) {
        return zps_client_einval(c, "announce the learning-rate table before zps_join "
                                    "(zps_declare_lr_table(c, groups, 0, NULL))");
    }
    char why[256];
    zps_err err = groups < 1 ? ZPS_EINVAL
                             : zps_decl_table(&c->decl, (uint32_t)groups, steps, lr, why,
                                              sizeof why);
    if (groups < 1) {
        snprintf(why, sizeof why, "a learning-rate table has at least one group, not %d",
                 groups);
    }
    if (err == ZPS_EINVAL) {
        return zps_client_einval(c, "%s", why);
    }
    return err == ZPS_OK ? ZPS_OK : zps_client_fail(c, err);
}
