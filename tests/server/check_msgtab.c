/* check_msgtab.c - the message table: every type from every kind of
 * sender (each CURVE role, none, and no CURVE at all), in every state of
 * the receiver, with and without its credential, against a spec written
 * here independently of server/zps_msgtab.c; then the cases that are
 * lies: a forged EVAL, a REGISTER of an assigned shard without its token,
 * indexes past their bounds. And the shard tokens' store. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/zps_plan.h"
#include "server/zps_msgtab.h"
#include "server/zps_token.h"
#include "tests/zps_check.h"
#include "tests/zps_tmpdir.h"

#define JOB 0x1234abcdull
#define RANK 2u
#define MEMBER 0x5151ull
#define SHARD 1u
#define TOKEN 0x7e57ull
#define GEN 3u

// A receiver that admitted rank 2 with MEMBER, whose plans know it, and
// whose shard 1 holds TOKEN once assigned.
typedef struct fake {
    bool assigned; // shard 1 assigned
} fake;

static bool s_member_ok(void *arg, uint32_t rank, uint64_t id)
{
    (void)arg;
    return rank == RANK && id == MEMBER;
}

static uint32_t s_newest(void *arg)
{
    (void)arg;
    return GEN;
}

static bool s_assigned(void *arg, uint32_t index)
{
    return index == SHARD && ((fake *)arg)->assigned;
}

static bool s_token_ok(void *arg, uint32_t index, uint64_t token)
{
    return index == SHARD && ((fake *)arg)->assigned && token == TOKEN;
}

static zps_msgtab_ctx s_ctx(fake *f, uint32_t at, bool curve)
{
    return (zps_msgtab_ctx){.at = at, .curve = curve, .job_id = JOB, .arg = f,
                            .member_ok = s_member_ok, .plan_member_ok = s_member_ok,
                            .newest_generation = s_newest, .shard_assigned = s_assigned,
                            .shard_token_ok = s_token_ok};
}

// A header of `type` with (good) or without the credential its senders hold.
static void s_header(Zps__Header *h, Zps__Register *reg, int type, bool good)
{
    zps__header__init(h);
    zps__register__init(reg);
    h->version = 1;
    h->type = (Zps__MsgType)type;
    h->job_id = JOB;
    h->generation = GEN;
    h->rank = RANK;
    h->member_id = good ? MEMBER : MEMBER + 1;
    h->shard = SHARD;
    h->shard_token = good ? TOKEN : 0;
    reg->index = SHARD;
    h->registration = reg;
}

// The spec. Senders: W worker, S shard, O operator keys. States: w
// waiting, a assigning, t training, d done, r recovering (shard 0); u
// unassigned, s serving (shards > 0). cred: - none, m member, t token,
// T token once assigned. reply: whether a refusal is answered.
typedef struct spec {
    int type;
    const char *roles;
    const char *at;
    char cred;
    bool job;
    bool reply;
} spec;

static const spec s_spec[] = {
    {ZPS__MSG_TYPE__HELLO, "W", "wtr", '-', false, true},
    {ZPS__MSG_TYPE__STATUS, "WSO", "watdr", '-', false, true},
    {ZPS__MSG_TYPE__REGISTER, "S", "watdr", 'T', false, true},
    {ZPS__MSG_TYPE__READY, "S", "at", 't', true, false},
    {ZPS__MSG_TYPE__STEP_DONE, "S", "tdr", 't', true, false},
    {ZPS__MSG_TYPE__EVAL, "W", "tdr", 'm', true, false},
    {ZPS__MSG_TYPE__BYE, "W", "tdr", 'm', true, false},
    {ZPS__MSG_TYPE__HEARTBEAT, "W", "tdr", 'm', true, false},
    {ZPS__MSG_TYPE__PUSH, "W", "tdrs", 'm', true, true},
    {ZPS__MSG_TYPE__PULL, "W", "tdrs", 'm', true, true},
    {ZPS__MSG_TYPE__INIT, "W", "tdrs", 'm', true, true},
    {ZPS__MSG_TYPE__NORM, "S", "tdr", 't', true, false},
};

static const struct {
    uint32_t bit;
    char letter;
} s_states[] = {{ZPS_AT_WAITING, 'w'},    {ZPS_AT_ASSIGNING, 'a'},  {ZPS_AT_TRAINING, 't'},
                {ZPS_AT_DONE, 'd'},       {ZPS_AT_RECOVERING, 'r'}, {ZPS_AT_UNASSIGNED, 'u'},
                {ZPS_AT_SERVING, 's'}};

// Kinds of sender: no CURVE (anyone), or a CURVE key with these roles.
static const struct {
    bool curve;
    const char *user_id;
    const char *letters; // roles it holds
} s_senders[] = {{false, "", "WSO"},     {true, "worker", "W"},       {true, "shard", "S"},
                 {true, "operator", "O"}, {true, "", ""},            {true, "nobody", ""},
                 {true, "worker,shard", "WS"}};

static const spec *s_spec_of(int type)
{
    for (size_t i = 0; i < sizeof s_spec / sizeof s_spec[0]; i++) {
        if (s_spec[i].type == type) {
            return &s_spec[i];
        }
    }
    return NULL; // nobody sends it
}

static bool s_any_in(const char *letters, const char *set)
{
    for (const char *p = letters; *p; p++) {
        if (strchr(set, *p)) {
            return true;
        }
    }
    return false;
}

// What the spec says a message of `type` meets: its code.
static zps_err s_expected(int type, size_t sender, char state, bool good, bool assigned)
{
    const spec *sp = s_spec_of(type);
    if (!sp) {
        return ZPS_EPROTO;
    }
    if (!s_any_in(s_senders[sender].letters, sp->roles)) {
        return ZPS_EPERM;
    }
    if (!strchr(sp->at, state)) {
        // After the last step a worker's message is answered "the job is
        // over", whatever it is: for the worker the job simply ended. A
        // shard not assigned yet answers what it serves once assigned
        // "not yet".
        if (state == 'd' && strchr(sp->roles, 'W')) {
            return ZPS_ECLOSED;
        }
        return state == 'u' && strchr(sp->at, 's') ? ZPS_EAGAIN : ZPS_ESTATE;
    }
    if (sp->cred == 'm') {
        return good ? ZPS_OK : ZPS_ENOENT;
    }
    if (sp->cred == 't' || (sp->cred == 'T' && assigned)) {
        return good && assigned ? ZPS_OK : ZPS_EPERM;
    }
    return ZPS_OK;
}

START_TEST(test_msgtab_every_type_from_every_sender_in_every_state_meets_the_spec)
{
    int checked = 0;
    for (int type = -1; type <= ZPS__MSG_TYPE__NORM + 2; type++) {
        const spec *sp = s_spec_of(type);
        const zps_msgtab_rule *r = zps_msgtab_rule_of(type);
        ck_assert_ptr_nonnull(r);
        ck_assert_msg(r->reply == (sp ? sp->reply : type != ZPS__MSG_TYPE__ERROR),
                      "type %d: reply %d", type, r->reply);
        ck_assert_msg(r->job_id == (sp && sp->job), "type %d: job id %d", type, r->job_id);
        for (size_t who = 0; who < sizeof s_senders / sizeof s_senders[0]; who++) {
            for (size_t k = 0; k < sizeof s_states / sizeof s_states[0]; k++) {
                for (int good = 0; good < 2; good++) {
                    for (int assigned = 0; assigned < 2; assigned++) {
                        fake f = {.assigned = assigned};
                        zps_msgtab_ctx x = s_ctx(&f, s_states[k].bit, s_senders[who].curve);
                        Zps__Header h;
                        Zps__Register reg;
                        s_header(&h, &reg, type, good);
                        char why[256];
                        zps_err got = zps_msgtab_check(&x, &h, s_senders[who].user_id, why,
                                                       sizeof why);
                        zps_err want = s_expected(type, who, s_states[k].letter, good, assigned);
                        ck_assert_msg(got == want,
                                      "type %d from '%s'%s in state %c, %s credential, shard "
                                      "%sassigned: %s (%s), expected %s",
                                      type, s_senders[who].user_id,
                                      s_senders[who].curve ? "" : " (no CURVE)",
                                      s_states[k].letter, good ? "its" : "no",
                                      assigned ? "" : "not ", zps_strerror(got), why,
                                      zps_strerror(want));
                        ck_assert_msg(got == ZPS_OK || why[0], "a refusal without a reason");
                        checked++;
                    }
                }
            }
        }
    }
    ck_assert_int_eq(checked, 23 * 7 * 7 * 4); // types -1..NORM+2
}
END_TEST

START_TEST(test_msgtab_forged_eval_bye_heartbeat_need_an_admitted_members_id)
{
    fake f = {.assigned = true};
    zps_msgtab_ctx x = s_ctx(&f, ZPS_AT_TRAINING, false);
    int types[] = {ZPS__MSG_TYPE__EVAL, ZPS__MSG_TYPE__BYE, ZPS__MSG_TYPE__HEARTBEAT};
    for (int i = 0; i < 3; i++) {
        Zps__Header h;
        Zps__Register reg;
        s_header(&h, &reg, types[i], true);
        char why[256];
        ck_assert_int_eq(zps_msgtab_check(&x, &h, "", why, sizeof why), ZPS_OK);
        h.member_id = 0; // what a peer that only read STATUS knows
        ck_assert_int_eq(zps_msgtab_check(&x, &h, "", why, sizeof why), ZPS_ENOENT);
        ck_assert_ptr_null(strstr(why, "0")); // the guess is not echoed
        h.member_id = MEMBER;
        h.rank = RANK + 1; // another's rank with one's own id
        ck_assert_int_eq(zps_msgtab_check(&x, &h, "", why, sizeof why), ZPS_ENOENT);
        h.rank = RANK;
        h.job_id = JOB + 1;
        ck_assert_int_eq(zps_msgtab_check(&x, &h, "", why, sizeof why), ZPS_EJOB);
    }
}
END_TEST

START_TEST(test_msgtab_register_needs_the_token_once_the_shard_is_assigned)
{
    Zps__Header h;
    Zps__Register reg;
    s_header(&h, &reg, ZPS__MSG_TYPE__REGISTER, false);
    char why[256];
    // Before the job starts anyone may claim shard 1 ...
    fake f = {.assigned = false};
    zps_msgtab_ctx x = s_ctx(&f, ZPS_AT_WAITING, false);
    ck_assert_int_eq(zps_msgtab_check(&x, &h, "", why, sizeof why), ZPS_OK);
    // ... once assigned, only the holder of its token, a restart included.
    f.assigned = true;
    x.at = ZPS_AT_TRAINING;
    ck_assert_int_eq(zps_msgtab_check(&x, &h, "", why, sizeof why), ZPS_EPERM);
    ck_assert_ptr_nonnull(strstr(why, "--resume"));
    h.shard_token = TOKEN + 1;
    ck_assert_int_eq(zps_msgtab_check(&x, &h, "", why, sizeof why), ZPS_EPERM);
    h.shard_token = TOKEN;
    ck_assert_int_eq(zps_msgtab_check(&x, &h, "", why, sizeof why), ZPS_OK);
    // The header and the body must claim the same shard: a token for one
    // must not pass a claim to another.
    reg.index = SHARD + 1;
    ck_assert_int_eq(zps_msgtab_check(&x, &h, "", why, sizeof why), ZPS_EPROTO);
    h.registration = NULL;
    ck_assert_int_eq(zps_msgtab_check(&x, &h, "", why, sizeof why), ZPS_EPROTO);
}
END_TEST

START_TEST(test_msgtab_indexes_past_their_bounds_are_refused_not_folded)
{
    fake f = {.assigned = true};
    zps_msgtab_ctx x = s_ctx(&f, ZPS_AT_TRAINING, false);
    Zps__Header h;
    Zps__Register reg;
    char why[256];
    s_header(&h, &reg, ZPS__MSG_TYPE__PUSH, true);
    // RANK + ZPS_MAX_MEMBERS is RANK modulo the table: once, it was taken for it.
    h.rank = RANK + ZPS_MAX_MEMBERS;
    ck_assert_int_eq(zps_msgtab_check(&x, &h, "", why, sizeof why), ZPS_ERANGE);
    s_header(&h, &reg, ZPS__MSG_TYPE__READY, true);
    h.shard = SHARD + ZPS_MAX_SHARDS;
    ck_assert_int_eq(zps_msgtab_check(&x, &h, "", why, sizeof why), ZPS_ERANGE);
    s_header(&h, &reg, ZPS__MSG_TYPE__REGISTER, true);
    h.shard = reg.index = SHARD + ZPS_MAX_SHARDS;
    ck_assert_int_eq(zps_msgtab_check(&x, &h, "", why, sizeof why), ZPS_ERANGE);
}
END_TEST

START_TEST(test_msgtab_push_of_a_plan_not_heard_of_passes_to_be_held)
{
    fake f = {.assigned = true};
    zps_msgtab_ctx x = s_ctx(&f, ZPS_AT_SERVING, false);
    Zps__Header h;
    Zps__Register reg;
    char why[256];
    s_header(&h, &reg, ZPS__MSG_TYPE__PUSH, false);
    ck_assert_int_eq(zps_msgtab_check(&x, &h, "", why, sizeof why), ZPS_ENOENT);
    // A newcomer's push can come before its plan: the server holds it and
    // checks it again when the plan comes. Not a PULL: nothing is held.
    h.generation = GEN + 1;
    ck_assert_int_eq(zps_msgtab_check(&x, &h, "", why, sizeof why), ZPS_OK);
    h.type = ZPS__MSG_TYPE__PULL;
    ck_assert_int_eq(zps_msgtab_check(&x, &h, "", why, sizeof why), ZPS_ENOENT);
}
END_TEST

START_TEST(test_msgtab_operator_key_may_ask_status_and_nothing_else)
{
    fake f = {.assigned = true};
    char why[256];
    for (int type = 0; type <= ZPS__MSG_TYPE__ROLLBACK; type++) {
        zps_msgtab_ctx x = s_ctx(&f, ZPS_AT_TRAINING, true);
        Zps__Header h;
        Zps__Register reg;
        s_header(&h, &reg, type, true);
        zps_err err = zps_msgtab_check(&x, &h, "operator", why, sizeof why);
        ck_assert_msg((type == ZPS__MSG_TYPE__STATUS) == (err == ZPS_OK), "type %d: %s", type,
                      why);
        // A worker key with every credential still cannot speak for a shard.
        err = zps_msgtab_check(&x, &h, "worker", why, sizeof why);
        ck_assert_msg(zps_msgtab_rule_of(type)->from != ZPS_FROM_SHARD || err == ZPS_EPERM,
                      "type %d from a worker key: %s", type, zps_strerror(err));
    }
}
END_TEST

START_TEST(test_msgtab_roles_come_from_the_user_id_only_under_curve)
{
    ck_assert_uint_eq(zps_msgtab_roles(false, "operator"), ZPS_ROLES_ANY);
    ck_assert_uint_eq(zps_msgtab_roles(true, "worker"), ZPS_ROLE_WORKER);
    ck_assert_uint_eq(zps_msgtab_roles(true, "shard,operator"),
                      ZPS_ROLE_SHARD | ZPS_ROLE_OPERATOR);
    ck_assert_uint_eq(zps_msgtab_roles(true, "workers"), 0);
    ck_assert_uint_eq(zps_msgtab_roles(true, "work"), 0);
    ck_assert_uint_eq(zps_msgtab_roles(true, ""), 0);
    ck_assert_uint_eq(zps_msgtab_roles(true, NULL), 0);
}
END_TEST

START_TEST(test_msgtab_claim_names_the_rank_or_shard_a_message_claims)
{
    Zps__Header h;
    Zps__Register reg;
    char out[32];
    s_header(&h, &reg, ZPS__MSG_TYPE__EVAL, true);
    zps_msgtab_claim(&h, out, sizeof out);
    ck_assert_str_eq(out, "rank 2");
    s_header(&h, &reg, ZPS__MSG_TYPE__REGISTER, true);
    reg.index = 5;
    zps_msgtab_claim(&h, out, sizeof out);
    ck_assert_str_eq(out, "shard 5");
    s_header(&h, &reg, ZPS__MSG_TYPE__STATUS, true);
    zps_msgtab_claim(&h, out, sizeof out);
    ck_assert_str_eq(out, "");
}
END_TEST

// ---------------------------------------------------------------------------
// Tokens.

START_TEST(test_token_is_random_never_zero_and_compares_exactly)
{
    uint64_t a, b;
    ck_assert_int_eq(zps_token_new(&a), ZPS_OK);
    ck_assert_int_eq(zps_token_new(&b), ZPS_OK);
    ck_assert_uint_ne(a, 0);
    ck_assert_uint_ne(a, b); // 2^-64
    ck_assert(zps_token_equal(a, a));
    ck_assert(!zps_token_equal(a, a ^ 1));
    ck_assert(!zps_token_equal(0, 0)); // "none" proves nothing
}
END_TEST

START_TEST(test_token_kept_owner_only_and_read_back_damage_refused)
{
    char dir[64];
    zps_tmpdir_make(dir, sizeof dir, "token");
    uint64_t t = 0;
    ck_assert_int_eq(zps_token_load(dir, 3, &t), ZPS_ENOENT);
    ck_assert_int_eq(zps_token_save(dir, 3, 0xfeedfacecafebeefull), ZPS_OK);
    ck_assert_int_eq(zps_token_load(dir, 3, &t), ZPS_OK);
    ck_assert_uint_eq(t, 0xfeedfacecafebeefull);
    char path[128];
    snprintf(path, sizeof path, "%s/shard-3.token", dir);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0600);
    // A flipped byte: the CRC refuses it.
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    fputc(0x55, f);
    fclose(f);
    ck_assert_int_eq(zps_token_load(dir, 3, &t), ZPS_EPROTO);

    uint64_t table[3] = {0, 11, 22}, back[3] = {0}, four[4];
    ck_assert_int_eq(zps_token_save_table(dir, table, 3), ZPS_OK);
    ck_assert_int_eq(zps_token_load_table(dir, back, 3), ZPS_OK);
    ck_assert_mem_eq(back, table, sizeof table);
    ck_assert_int_eq(zps_token_load_table(dir, four, 4), ZPS_EPROTO); // another job's shape
    snprintf(path, sizeof path, "%s/shard-tokens", dir);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0600);
    ck_assert_int_eq(zps_tmpdir_remove(dir), 0);
}
END_TEST

Suite *zps_suite_msgtab(void)
{
    Suite *s = suite_create("msgtab");
    TCase *tc = tcase_create("table");
    tcase_add_test(tc, test_msgtab_every_type_from_every_sender_in_every_state_meets_the_spec);
    tcase_add_test(tc, test_msgtab_forged_eval_bye_heartbeat_need_an_admitted_members_id);
    tcase_add_test(tc, test_msgtab_register_needs_the_token_once_the_shard_is_assigned);
    tcase_add_test(tc, test_msgtab_indexes_past_their_bounds_are_refused_not_folded);
    tcase_add_test(tc, test_msgtab_push_of_a_plan_not_heard_of_passes_to_be_held);
    tcase_add_test(tc, test_msgtab_operator_key_may_ask_status_and_nothing_else);
    tcase_add_test(tc, test_msgtab_roles_come_from_the_user_id_only_under_curve);
    tcase_add_test(tc, test_msgtab_claim_names_the_rank_or_shard_a_message_claims);
    suite_add_tcase(s, tc);
    TCase *tt = tcase_create("token");
    tcase_add_test(tt, test_token_is_random_never_zero_and_compares_exactly);
    tcase_add_test(tt, test_token_kept_owner_only_and_read_back_damage_refused);
    suite_add_tcase(s, tt);
    return s;
}
