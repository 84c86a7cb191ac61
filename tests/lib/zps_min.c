/* zps_min.c - the smallest program on libzps: built against the installed
 * header and zps.pc only (tests/lib/install.sh), it joins a job and trains.
 *
 * Its model is the job's flat parameter vector p with the loss of each
 * sample j, 0.5 ||p - t_j||^2, t_j = 0.001 j: the gradient of a piece is
 * p - mean(t_j) over its samples, computed the same on any worker. It
 * checks the version, an error sentence, that the job ends with
 * ZPS_NEXT_DONE after every step, and that the loss went down. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zps.h>

static double s_loss(const float *p, size_t n, double target)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) {
        s += 0.5 * (p[i] - target) * (p[i] - target);
    }
    return s / (double)n;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: zps_min COORDINATOR\n");
        return 2;
    }
    int major;
    if (zps_version(&major, NULL, NULL) != ZPS_VERSION || major != ZPS_VERSION_MAJOR) {
        fprintf(stderr, "zps_min: header %d, library %d\n", ZPS_VERSION, zps_version(0, 0, 0));
        return 1;
    }
    zps_client *c = zps_client_new(argv[1]);
    if (!c) {
        return 1;
    }
    if (zps_client_set_int(c, ZPS_OPT_HEARTBEAT_MS, 1) != ZPS_EINVAL || !*zps_errmsg(c)) {
        fprintf(stderr, "zps_min: a bad option was taken\n");
        return 1;
    }
    printf("bad option: %s\n", zps_errmsg(c));
    if (zps_connect(c) != ZPS_OK || zps_join(c) != ZPS_OK) {
        fprintf(stderr, "zps_min: join: %s\n", zps_errmsg(c));
        return 1;
    }
    size_t n = (size_t)zps_info_u64(c, ZPS_INFO_N_PARAMS);
    int n_buckets = (int)zps_info_u64(c, ZPS_INFO_N_BUCKETS);
    float *params = calloc(n, sizeof(float)), *grad = calloc(n, sizeof(float));
    if (!params || !grad || zps_set_params(c, params, n) != ZPS_OK) {
        return 1;
    }
    double first = -1, last = -1, target = 0;
    uint64_t pieces = 0;
    zps_work w;
    int r;
    while ((r = zps_next_work(c, &w)) != ZPS_NEXT_DONE) {
        if (r == ZPS_NEXT_ROLLBACK || r == ZPS_NEXT_REJOINED) {
            continue;
        }
        if (r != ZPS_NEXT_WORK) {
            fprintf(stderr, "zps_min: zps_next_work %d: %s\n", r, zps_errmsg(c));
            return 1;
        }
        if (zps_work_start(c, &w) != ZPS_OK) {
            continue;
        }
        // mean of t_j over samples [offset, offset + count)
        target = 0.001 * (w.offset + (w.count - 1) / 2.0);
        float loss = (float)s_loss(params, n, target);
        first = first < 0 ? loss : first;
        last = loss;
        for (size_t i = 0; i < n; i++) {
            grad[i] = params[i] - (float)target;
        }
        for (int b = 0; b < n_buckets; b++) {
            if (zps_push_bucket(c, &w, b, grad, loss) != ZPS_OK) {
                fprintf(stderr, "zps_min: push: %s\n", zps_errmsg(c));
                return 1;
            }
        }
        if (zps_work_done(c, &w) != ZPS_OK) {
            return 1;
        }
        pieces++;
    }
    uint64_t steps = zps_info_u64(c, ZPS_INFO_TOTAL_STEPS);
    printf("done: %llu pieces of %llu steps, loss %.4f -> %.4f\n", (unsigned long long)pieces,
           (unsigned long long)steps, first, s_loss(params, n, target));
    zps_leave(c);
    zps_client_destroy(&c);
    int ok = pieces >= steps && s_loss(params, n, target) < first && last < first;
    free(params);
    free(grad);
    return ok ? 0 : 1;
}
