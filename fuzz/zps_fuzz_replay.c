/* zps_fuzz_replay.c - runs the fuzz target (zps_fuzz_msg.c) once over each
 * saved input, without libFuzzer, so that make test (and make test SAN=1)
 * replays the seed corpus and every input that once broke the target
 * (fuzz/regressions/) with the compiler and sanitizers of that build.
 *
 * Usage: zps_fuzz_replay FILE|DIR... ; a finding aborts (non-zero exit),
 * and the input being run is named first on stderr. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// Runs one file; -1 if it cannot be read.
static int s_run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? 2 * cap : 4096;
            uint8_t *more = realloc(buf, cap);
            if (!more) {
                free(buf);
                (void)fclose(f);
                return -1;
            }
            buf = more;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            break;
        }
    }
    int failed = ferror(f) != 0;
    (void)fclose(f); // read only: nothing to lose
    if (failed) {
        perror(path);
        free(buf);
        return -1;
    }
    // Named before it runs: a finding aborts the process.
    fprintf(stderr, "replay %s (%zu bytes)\n", path, len);
    LLVMFuzzerTestOneInput(buf, len);
    free(buf);
    return 0;
}

// Runs a file, or every regular file of a directory (not recursive), in
// name order so that runs are repeatable.
static int s_run_path(const char *path, int *count)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        perror(path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        (*count)++;
        return s_run_file(path);
    }
    struct dirent **names;
    int n = scandir(path, &names, NULL, alphasort);
    if (n < 0) {
        perror(path);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        char sub[4096];
        const char *name = names[i]->d_name;
        // Dot files (.gitkeep) are not inputs; nor are names too long to open.
        if (name[0] != '.' && snprintf(sub, sizeof sub, "%s/%s", path, name) < (int)sizeof sub &&
            stat(sub, &st) == 0 && S_ISREG(st.st_mode)) {
            (*count)++;
            rc |= s_run_file(sub);
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    int rc = 0, count = 0;
    for (int i = 1; i < argc; i++) {
        rc |= s_run_path(argv[i], &count);
    }
    fprintf(stderr, "zps_fuzz_replay: %d inputs, %s\n", count, rc ? "some unreadable" : "passed");
    return rc ? EXIT_FAILURE : EXIT_SUCCESS;
}
