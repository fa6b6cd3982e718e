#include "metric.h"

#include <math.h>
#include <string.h>

const struct kd_metric_info kd_metrics[KD_NMETRICS] = {
    [KD_L2] = {"l2", KD_L2, 0, 0, 1.0f, INFINITY},
    [KD_IP] = {"ip", KD_IP, 1, 0, -1.0f, -INFINITY},
    [KD_COSINE] = {"cosine", KD_COSINE, 1, 1, -1.0f, -INFINITY},
};

const struct kd_metric_info *kd_metric_named(const char *name)
{
    for (int i = 0; i < KD_NMETRICS; i++)
        if (strcmp(kd_metrics[i].name, name) == 0)
            return &kd_metrics[i];
    return NULL;
}
