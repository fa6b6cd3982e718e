/* metric.h — one table row per metric: everything that differs between
 * l2, ip and cosine outside the distance kernels themselves.
 *
 * Internally every metric is a distance, smaller is closer: l2 is the squared
 * distance, ip and cosine are minus the similarity. The row says how to turn
 * that into the user's value and what a missing result holds. Callers look
 * the row up once per call; the kernels still branch on the code. */
#ifndef KD_METRIC_H
#define KD_METRIC_H

#include <stddef.h>

/* Codes are stored in index files: never renumber them. */
enum kd_metric { KD_L2 = 0, KD_IP = 1, KD_COSINE = 2 };
#define KD_NMETRICS 3

struct kd_metric_info {
    const char *name;     /* "l2", "ip", "cosine" */
    int code;             /* enum kd_metric */
    int larger_is_better; /* the user's value is a similarity */
    int normalized;       /* vectors and queries are scaled to unit length */
    float sign;           /* user value = sign * internal value */
    float missing;        /* the user's value of a result slot with no vector */
};

extern const struct kd_metric_info kd_metrics[KD_NMETRICS];

/* The row of a code, or NULL when the code is unknown. */
static inline const struct kd_metric_info *kd_metric(int code)
{
    return code >= 0 && code < KD_NMETRICS ? &kd_metrics[code] : NULL;
}

/* The row named `name`, or NULL. */
const struct kd_metric_info *kd_metric_named(const char *name);

/* The internal distance d as the user sees it. */
static inline float kd_metric_to_user(const struct kd_metric_info *m, float d)
{
    return m->sign * d;
}

#endif
