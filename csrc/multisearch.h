/* multisearch.h — one search over several indexes, the segments of a
 * collection. Searching each and merging would read a whole shortlist per
 * segment; here every segment's graph search runs first, ONE shortlist of
 * ceil(k * oversample) is chosen across them by estimate (comparable when
 * the segments share a quantizer) and read as one batch over all their
 * files, so a query reads what a one-index search reads.
 *
 * Read locks are taken in address order: writer-preferring locks taken in
 * array order could deadlock two calls that list the indexes differently.
 * `queries` is counted once per query, on the first index with live
 * vectors; every other counter stays with the index it happened in. */
#ifndef KD_MULTISEARCH_H
#define KD_MULTISEARCH_H

#include <stddef.h>
#include <stdint.h>

#include "index.h"

/* Search the n indexes ixs (same dim and metric, each at most once) as one:
 * dist and ids get nq * sp->k results as kd_index_search writes them. Indexes
 * without live vectors are skipped; with no index at all (n = 0) there is no
 * metric, and missing results are +inf and -1. sp->filter applies to every
 * index; its ids found in none are ignored. */
int kd_search_many(struct kd_index **ixs, size_t n, const float *q, size_t nq,
                   const struct kd_search_params *sp, float *dist, int64_t *ids);

#endif
