/* calibrate.h — how recall@k grows with the beam (ef) and the shortlist
 * length, measured over queries whose true neighbours are known: the table a
 * recall target is chosen from (the Python layer keeps it in the index file).
 *
 * One call measures one ef. Each query's graph search keeps the longest
 * shortlist; a shorter one is its prefix (the shortlist is the best of the
 * nodes the beam scored, and the beam does not depend on its length), so
 * every length is scored from the same search. What a prefix's exact rerank
 * would return of the truth is the truth it holds (fewer than k vectors are
 * closer than a true neighbour), so nothing is read or rescored. */
#ifndef KD_CALIBRATE_H
#define KD_CALIBRATE_H

#include "index.h"

struct kd_sweep {
    const float *q; /* nq x dim */
    size_t nq;
    /* Per query, an id searched as if it had never been added (a query made
     * of that vector, asked as an unseen one would be); -1 none; NULL: none.
     * A query hiding the graph's entry node is left out of nqueries. */
    const int64_t *hidden;
    const int64_t *truth; /* nq x k ids, -1 where a query has fewer */
    /* Optional: the same searches' shortlists over a subset of the rows
     * alone (half of them: how much deeper a true neighbour sits with twice
     * the vectors competing, at the same beam). half_truth: nq x k ids, each
     * query's true neighbours within it; NULL: none. The subset: the ids of
     * half_ids, or with half_ids NULL those kd_in_half puts in for
     * half_salt (nothing to build per call: a filter of 500,000 ids took
     * 12 ms a call at 1M rows, a calibration makes dozens of calls). */
    const int64_t *half_ids, *half_truth;
    size_t nhalf;
    uint64_t half_salt;
    size_t k, ef;
    const uint32_t *lens; /* shortlist lengths, ascending, each >= k */
    size_t nlens;
    unsigned threads; /* 0: all cores */
    /* out */
    double *recall; /* nlens: true neighbours found / true neighbours */
    double *spread; /* nlens: standard deviation of a query's recall */
    /* nlens, with half_ids: recall of the subset's shortlists (its rows
     * among the longest shortlist, in order); NaN at a length that some
     * query's full shortlist held too few of them to fill. */
    double *half_recall;
    double scored;   /* code distances the graph search computed, mean per query */
    double refined;  /* candidates re-estimated with refinements, mean per query */
    size_t nqueries; /* queries measured (with a true neighbour, not left out) */
};

/* Whether id is in salt's half: a bit of a mixed hash of both (splitmix64's
 * finish), so that about half of any set of ids is, whatever their order
 * or spacing. */
int kd_in_half(int64_t id, uint64_t salt);

/* 0 or -errno: -EINVAL for bad lengths, -ESRCH for a hidden id not live. */
int kd_index_recall_sweep(struct kd_index *ix, struct kd_sweep *sw);

#endif
