/* open_memory: the edges of kdtr_open_memory that read_bundle --memory does not reach.
 *
 * usage: open_memory GOOD.kdtr   (a valid bundle with at least one tensor of >= 1 byte)
 * Checks, printing one "ok <what>" line each and exiting 1 at the first failure:
 *   NULL with size 0 and an empty buffer are a "truncated" error naming the given name;
 *   NULL with a non-zero size is an error, not a crash; a NULL err buffer is allowed;
 *   a good bundle opens, its tensors are 16-byte aligned and inside the reader's own copy, and
 *   they do not change when the caller overwrites and frees its buffer;
 *   kdtr_open and kdtr_open_memory agree on every field of every tensor.
 * Used by tests/format/test_kdtr_h.py (built with the same warnings and sanitizers as read_bundle.c).
 */
#include "kdtr.h"

static int failures = 0;

static void check(int ok, const char *what, const char *detail) {
    printf("%s %s%s%s\n", ok ? "ok" : "FAIL", what, detail ? ": " : "", detail ? detail : "");
    if (!ok) failures++;
}

static unsigned char *slurp(const char *path, size_t *size) {
    FILE *fp = fopen(path, "rb");
    unsigned char *buf;
    long n;
    if (!fp || fseek(fp, 0, SEEK_END) != 0 || (n = ftell(fp)) <= 0 || fseek(fp, 0, SEEK_SET)) {
        if (fp) fclose(fp);
        return NULL;
    }
    buf = (unsigned char *)malloc((size_t)n);
    if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(fp);
    *size = (size_t)n;
    return buf;
}

int main(int argc, char **argv) {
    kdtr_file f, g;
    char err[512];
    unsigned char byte = 'K';
    unsigned char *buf;
    size_t size = 0, i;
    uint32_t *crcs;
    if (argc != 2) {
        fprintf(stderr, "usage: open_memory GOOD.kdtr\n");
        return 2;
    }
    check(kdtr_open_memory(NULL, 0, "empty", &f, err, sizeof err) == -1 &&
              strncmp(err, "empty: truncated", 16) == 0, "NULL, 0", err);
    check(kdtr_open_memory(&byte, 0, "zero", &f, err, sizeof err) == -1 &&
              strncmp(err, "zero: truncated", 15) == 0, "size 0", err);
    check(kdtr_open_memory(&byte, 1, "one", &f, err, sizeof err) == -1 &&
              strncmp(err, "one: truncated", 14) == 0, "size 1", err);
    check(kdtr_open_memory(NULL, 24, "null", &f, err, sizeof err) == -1 &&
              strncmp(err, "null: no data", 13) == 0, "NULL, 24", err);
    check(kdtr_open_memory(NULL, 0, "quiet", &f, NULL, 0) == -1 && f.buf == NULL,
          "NULL err buffer", NULL);

    if (!(buf = slurp(argv[1], &size))) {
        check(0, "read the good bundle", argv[1]);
        return 1;
    }
    if (kdtr_open_memory(buf, size, argv[1], &f, err, sizeof err) != 0) {
        check(0, "good bundle opens", err);
        free(buf);
        return 1;
    }
    check(f.size == size && f.ntensors > 0, "good bundle opens", NULL);
    crcs = (uint32_t *)malloc(f.ntensors * sizeof *crcs);
    for (i = 0; i < f.ntensors; i++) {
        const kdtr_tensor *t = &f.tensors[i];
        const unsigned char *d = (const unsigned char *)t->data;
        check(((uintptr_t)d % 16) == 0, "tensor data 16-byte aligned", t->name);
        check(d >= f.buf + f.data_start && (size_t)(d - f.buf) <= f.size &&
                  t->nbytes <= f.size - (size_t)(d - f.buf),
              "tensor inside the reader's copy", t->name);
        crcs[i] = kdtr_crc32(0, d, (size_t)t->nbytes);
    }
    memset(buf, 0xa5, size);
    free(buf);      /* the caller's buffer is gone: the kdtr_file must not need it */
    for (i = 0; i < f.ntensors; i++)
        check(kdtr_crc32(0, f.tensors[i].data, (size_t)f.tensors[i].nbytes) == crcs[i] &&
                  crcs[i] == f.tensors[i].crc32,
              "tensor unchanged after the caller's buffer is freed", f.tensors[i].name);
    free(crcs);

    if (kdtr_open(argv[1], &g, err, sizeof err) != 0) {
        check(0, "kdtr_open of the same file", err);
    } else {
        int same = g.ntensors == f.ntensors && g.data_start == f.data_start &&
                   g.data_len == f.data_len && g.size == f.size && g.meta_len == f.meta_len;
        for (i = 0; same && i < f.ntensors; i++) {
            const kdtr_tensor *a = &f.tensors[i], *b = &g.tensors[i];
            same = strcmp(a->name, b->name) == 0 && a->role_id == b->role_id &&
                   a->dtype_id == b->dtype_id && a->ndim == b->ndim && a->offset == b->offset &&
                   a->nbytes == b->nbytes && a->crc32 == b->crc32 &&
                   memcmp(a->shape, b->shape, sizeof a->shape) == 0 &&
                   memcmp(a->data, b->data, (size_t)a->nbytes) == 0;
        }
        check(same, "kdtr_open and kdtr_open_memory agree", NULL);
        kdtr_close(&g);
    }
    kdtr_close(&f);
    kdtr_close(&f);     /* closing twice is safe: kdtr_close zeroes the struct */
    return failures ? 1 : 0;
}
