#include "idmap.h"
#include "common.h"

#include <stdlib.h>
#include <string.h>

static inline size_t slot_of(int64_t key, size_t cap)
{
    uint64_t h = (uint64_t)key * 0x9e3779b97f4a7c15ull;
    return (size_t)(h ^ (h >> 29)) & (cap - 1);
}

static int alloc_table(struct kd_idmap *m, size_t cap)
{
    m->keys = malloc(cap * sizeof(int64_t));
    m->rows = malloc(cap * sizeof(uint32_t));
    if (!m->keys || !m->rows) {
        free(m->keys);
        free(m->rows);
        m->keys = NULL;
        m->rows = NULL;
        return kd_fail(-ENOMEM, "out of memory for the id map");
    }
    memset(m->rows, 0xff, cap * sizeof(uint32_t));
    m->cap = cap;
    m->size = 0;
    return 0;
}

int kd_idmap_init(struct kd_idmap *m, size_t expected)
{
    size_t cap = 16;
    while (cap < expected * 2)
        cap <<= 1;
    return alloc_table(m, cap);
}

void kd_idmap_free(struct kd_idmap *m)
{
    free(m->keys);
    free(m->rows);
    memset(m, 0, sizeof *m);
}

static void insert_fresh(struct kd_idmap *m, int64_t key, uint32_t row)
{
    size_t i = slot_of(key, m->cap);
    while (m->rows[i] != KD_NO_ROW)
        i = (i + 1) & (m->cap - 1);
    m->keys[i] = key;
    m->rows[i] = row;
    m->size++;
}

int kd_idmap_reserve(struct kd_idmap *m, size_t more)
{
    size_t need = (m->size + more) * 2;
    if (need <= m->cap)
        return 0;
    size_t cap = m->cap;
    while (cap < need)
        cap <<= 1;
    struct kd_idmap old = *m;
    int err = alloc_table(m, cap);
    if (err) {
        *m = old;
        return err;
    }
    for (size_t i = 0; i < old.cap; i++)
        if (old.rows[i] != KD_NO_ROW)
            insert_fresh(m, old.keys[i], old.rows[i]);
    free(old.keys);
    free(old.rows);
    return 0;
}

uint32_t kd_idmap_get(const struct kd_idmap *m, int64_t key)
{
    size_t i = slot_of(key, m->cap);
    while (m->rows[i] != KD_NO_ROW) {
        if (m->keys[i] == key)
            return m->rows[i];
        i = (i + 1) & (m->cap - 1);
    }
    return KD_NO_ROW;
}

/* How many ids ahead a batch lookup fetches slots: enough misses in flight
 * to overlap; 8 to 64 measured alike on a filter of 500,000 ids at 1M. */
#define LOOKAHEAD 16

void kd_idmap_get_many(const struct kd_idmap *m, const int64_t *keys, size_t n, uint32_t *rows)
{
    for (size_t i = 0; i < n; i++) {
        if (i + LOOKAHEAD < n) {
            size_t s = slot_of(keys[i + LOOKAHEAD], m->cap);
            __builtin_prefetch(&m->rows[s]);
            __builtin_prefetch(&m->keys[s]);
        }
        rows[i] = kd_idmap_get(m, keys[i]);
    }
}

int kd_idmap_put(struct kd_idmap *m, int64_t key, uint32_t row)
{
    if (kd_idmap_get(m, key) != KD_NO_ROW)
        return -EEXIST;
    insert_fresh(m, key, row);
    return 0;
}

void kd_idmap_del(struct kd_idmap *m, int64_t key)
{
    size_t mask = m->cap - 1, i = slot_of(key, m->cap);
    while (m->rows[i] != KD_NO_ROW && m->keys[i] != key)
        i = (i + 1) & mask;
    if (m->rows[i] == KD_NO_ROW)
        return;
    /* Shift later members of the probe run back into the hole. */
    size_t hole = i;
    for (size_t j = (i + 1) & mask; m->rows[j] != KD_NO_ROW; j = (j + 1) & mask) {
        size_t home = slot_of(m->keys[j], m->cap);
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            m->keys[hole] = m->keys[j];
            m->rows[hole] = m->rows[j];
            hole = j;
        }
    }
    m->rows[hole] = KD_NO_ROW;
    m->size--;
}

size_t kd_idmap_bytes(const struct kd_idmap *m)
{
    return m->cap * (sizeof(int64_t) + sizeof(uint32_t));
}
