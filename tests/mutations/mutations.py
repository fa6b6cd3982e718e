"""The curated mutation list of tests/mutations/run.py.

Each mutation breaks one thing on purpose. `edits` is a list of
(original, replacement) pairs in `file`; every original must occur exactly
once in the file, else the mutation is reported as stale (the code moved:
update the anchor). `tests` are pytest node ids or files, as few as give a
verdict: at least one of them must fail on the mutated code. `est` is the
expected seconds (build included) used for the time estimate before a run.
`why` says in one line what a user would lose if the mutation shipped.

Not collected by pytest (the name matches neither test_*.py nor *_test.py).
Lines may be long: the anchors are verbatim lines of the C sources.
"""
# ruff: noqa: E501

B = "Py_BEGIN_ALLOW_THREADS"
E = "Py_END_ALLOW_THREADS"


def _gil(snippet):
    """Edits that keep the GIL held across the core call in `snippet`: the
    two macros become the plain braces they open and close."""
    return [(snippet, snippet.replace(B, "{").replace(E, "}"))]


MUTATIONS = [
    # ---- 1. the GIL released around each long core call
    dict(name="gil-load-path", file="csrc/pyext/pyreader.c",
         edits=_gil("Py_BEGIN_ALLOW_THREADS err = kd_index_load_path(&ix, path);\n"
                    "    Py_END_ALLOW_THREADS Py_DECREF(pathobj);"),
         tests=["tests/test_storage_io.py::test_gil_released_while_loading[path]"],
         est=35, why="knndirect.load(path) would stop every other Python thread for the whole load"),
    dict(name="gil-load-bytes", file="csrc/pyext/pyreader.c",
         edits=_gil("Py_BEGIN_ALLOW_THREADS err = kd_index_load(&ix, &r);\n"
                    "    Py_END_ALLOW_THREADS PyBuffer_Release(&v);"),
         tests=["tests/test_storage_io.py::test_gil_released_while_loading[bytes]"],
         est=35, why="knndirect.load(bytes) would hold the GIL while parsing and checking"),
    dict(name="gil-load-file", file="csrc/pyext/pyreader.c",
         edits=_gil("Py_BEGIN_ALLOW_THREADS err = kd_index_load(&ix, &r);\n"
                    "    Py_END_ALLOW_THREADS if (kd_pyreader_finish(&pr))"),
         tests=["tests/test_storage_io.py::test_gil_released_while_loading[file]"],
         est=35, why="knndirect.load(file object) would hold the GIL between the chunk reads"),
    dict(name="gil-save-path", file="csrc/pyext/index.c",
         edits=_gil("Py_BEGIN_ALLOW_THREADS err = kd_index_save_path(ix, path);\n"
                    "        Py_END_ALLOW_THREADS kd_py_leave(self);"),
         tests=["tests/test_storage_io.py::test_gil_released_while_saving[path]",
                "tests/test_hardening_concurrency.py::test_gil_released_during_long_calls[save]"],
         est=40, why="Index.save(path) would stop other threads for the whole write and fsync"),
    dict(name="gil-save-file", file="csrc/pyext/index.c",
         edits=_gil("    if (kd_pywriter_init(&w, &pw, file)) {\n"
                    "        kd_py_leave(self);\n"
                    "        return NULL;\n"
                    "    }\n"
                    "    Py_BEGIN_ALLOW_THREADS err = kd_index_save(ix, &w);\n"
                    "    Py_END_ALLOW_THREADS kd_py_leave(self);"),
         tests=["tests/test_storage_io.py::test_gil_released_while_saving[file]"],
         est=35, why="Index.save(file object) would hold the GIL between the chunk writes"),
    dict(name="gil-add", file="csrc/pyext/index.c",
         edits=_gil("Py_BEGIN_ALLOW_THREADS err = kd_index_add(ix, xv.buf, n, ids, threads);\n"
                    "        Py_END_ALLOW_THREADS"),
         tests=["tests/test_hardening_concurrency.py::test_gil_released_during_long_calls[add]"],
         est=40, why="Index.add (graph construction, the longest call) would freeze other threads"),
    dict(name="gil-search", file="csrc/pyext/index.c",
         edits=_gil("Py_BEGIN_ALLOW_THREADS err = kd_index_search(ix, s.qv.buf, s.nq, &s.sp,\n"
                    "                                                     PyArray_DATA((PyArrayObject *)s.dist),\n"
                    "                                                     PyArray_DATA((PyArrayObject *)s.ids));\n"
                    "        Py_END_ALLOW_THREADS\n"
                    "    }\n"
                    "    kd_py_leave(self);\n"
                    "    return kd_py_search_finish(&s, err);"),
         tests=["tests/test_hardening_concurrency.py::test_gil_released_during_long_calls[search]",
                "tests/test_hardening_concurrency.py::test_gil_released_during_long_calls[exact]"],
         est=40, why="searches from several Python threads would run one at a time"),
    dict(name="gil-get-vectors", file="csrc/pyext/index.c",
         edits=_gil("Py_BEGIN_ALLOW_THREADS err = kd_index_get_vectors(ix, ids, n, base + skip, stride);\n"
                    "    Py_END_ALLOW_THREADS out : Py_XDECREF(raw);"),
         tests=["tests/test_hardening_concurrency.py::test_gil_released_during_long_calls[get_vectors]"],
         est=40, why="get_vectors would hold the GIL through its SSD reads"),

    # ---- 2. the recall measure
    dict(name="recall-at-k-always-one", file="python/knndirect/datasets.py",
         edits=[("    return hits / total if total else 1.0", "    return 1.0")],
         tests=["tests/test_datasets.py"],
         est=15, why="every recall figure (benchmarks, CLI, docs) would read 1.0 whatever the search returns"),

    # ---- 3. the filter cost model
    dict(name="filter-always-exact", file="csrc/search.c",
         edits=[("    return exact_cost <= graph_cost;\n}", "    return 1;\n}")],
         tests=["tests/test_remove_filter.py::test_filter_graph_search_honours_filter",
                "tests/test_remove_filter.py::test_filtered_graph_search_with_removed_ids",
                "tests/test_exact_search.py::test_filter_selectivity"],
         est=45, why="every filtered search would scan all allowed vectors exactly (slow for loose filters)"),
    dict(name="filter-always-graph", file="csrc/search.c",
         edits=[("    return exact_cost <= graph_cost;\n}", "    return 0;\n}")],
         tests=["tests/test_remove_filter.py::test_filter_of_one_percent_takes_the_exact_scan",
                "tests/test_exact_search.py::test_filter_selectivity"],
         est=45, why="tight filters would walk the graph, rejecting almost every node (slow, poor recall)"),

    # ---- 4. early reads
    dict(name="early-reads-off", file="csrc/search.c",
         edits=[("early_ok = reading && may_read_early && !ix->refine;", "early_ok = 0;")],
         tests=["tests/test_early_reads.py"],
         est=35, why="the SSD reads would no longer overlap the graph walk (higher latency on io_uring)"),

    # ---- 5. checksums
    dict(name="crc-parse-skipped", file="csrc/format.c",
         edits=[("        if (kd_crc32c(0, base + s->offset, s->length) != s->crc)",
                 "        if (0 && kd_crc32c(0, base + s->offset, s->length) != s->crc)")],
         tests=["tests/test_corrupt_index.py::test_bit_flips_refused_at_open_and_load",
                "tests/test_corrupt_index.py::test_checksum_mismatch_names_the_section",
                "tests/test_storage_damage.py::test_random_byte_flips"],
         est=45, why="a damaged section checked at parse (the metadata at open) would be accepted"),
    dict(name="crc-stream-skipped", file="csrc/format.c",
         edits=[("        else if (s.crc != got->crc)", "        else if (0 && s.crc != got->crc)")],
         tests=["tests/test_corrupt_index.py::test_bit_flips_refused_at_open_and_load",
                "tests/test_corrupt_index.py::test_checksum_mismatch_names_the_section",
                "tests/test_storage_damage.py::test_random_byte_flips"],
         est=45, why="load (path, bytes, file object) would accept a file with damaged sections"),
    dict(name="crc-scan-skipped", file="csrc/format.c",
         edits=[("    if (!err && crc != sec->crc)\n        err = kd_fail(",
                 "    if (0 && crc != sec->crc)\n        err = kd_fail(")],
         tests=["tests/test_corrupt_index.py::test_bit_flips_refused_at_open_and_load",
                "tests/test_corrupt_index.py::test_checksum_mismatch_names_the_section",
                "tests/test_storage_damage.py::test_random_byte_flips"],
         est=45, why="open() would accept damaged graph, codes or ids sections"),
    dict(name="crc-verify-vectors-skipped", file="csrc/persist.c",
         edits=[("        if (!err && crc != vs->crc)", "        if (0 && crc != vs->crc)")],
         tests=["tests/test_corrupt_index.py::test_vector_flips_found_by_verify",
                "tests/test_corrupt_index.py::test_verify_finds_damage_after_open"],
         est=40, why="verify() on an opened index would never find damaged vectors on disk"),

    # ---- 6. the top-k heap
    dict(name="topk-heap-off-by-one", file="csrc/exact.h",
         edits=[("            if (c >= k)\n                break;",
                 "            if (c >= k - 1)\n                break;")],
         tests=["tests/test_exact_search.py::test_exact_batch_in_memory",
                "tests/test_search_api.py", "tests/test_recall.py"],
         est=60, why="the last slot of the top-k heap is never sifted: a worse result can stay in the answer"),

    # ---- 7. fault injection
    dict(name="fault-hook-never-fires", file="csrc/common.h",
         edits=[("        return kd_fault_apply(write, res);\n    return res;",
                 "        return res;\n    return res;")],
         tests=["tests/test_hardening_faults.py"],
         est=60, why="every fault-injection test would pass vacuously, whatever the error paths do"),

    # ---- others
    dict(name="tombstone-ignored-in-graph", file="csrc/hnsw.c",
         edits=[("    return !a || ((!a->deleted || !a->deleted[row]) && (!a->allowed || a->allowed[row]));",
                 "    return !a || (!a->allowed || a->allowed[row]);")],
         tests=["tests/test_remove_filter.py::test_removed_ids_never_returned",
                "tests/test_remove_filter.py::test_filtered_graph_search_with_removed_ids"],
         est=40, why="removed ids would come back from graph searches"),
    dict(name="filter-ignored-in-graph", file="csrc/hnsw.c",
         edits=[("    return !a || ((!a->deleted || !a->deleted[row]) && (!a->allowed || a->allowed[row]));",
                 "    return !a || (!a->deleted || !a->deleted[row]);")],
         tests=["tests/test_remove_filter.py::test_filter_graph_search_honours_filter",
                "tests/test_remove_filter.py::test_filtered_graph_search_with_removed_ids"],
         est=40, why="a filtered graph search would return ids outside the filter"),
    dict(name="cosine-query-not-normalized", file="csrc/search.c",
         edits=[("    if (!ix->metric->normalized)\n        return q;\n    float inv",
                 "    if (1)\n        return q;\n    float inv")],
         tests=["tests/test_metric_table.py", "tests/test_search_api.py::test_known_small_example_each_metric"],
         est=40, why="cosine graph searches would report scaled similarities (> 1)"),
    dict(name="read-bytes-not-counted", file="csrc/vecio_backend.h",
         edits=[("    c->read_ops++;\n    c->read_bytes += bytes;\n}", "    c->read_ops++;\n}")],
         tests=["tests/test_read_volume.py"],
         est=40, why="stats()['read_bytes'] would read 0: the SSD traffic could not be measured"),
    dict(name="bounce-copy-offset", file="csrc/vecio_backend.h",
         edits=[("memcpy(r->copy_to, r->buf + r->skip, v->record_bytes);",
                 "memcpy(r->copy_to, r->buf, v->record_bytes);")],
         tests=["tests/test_alignment.py"],
         est=45, why="O_DIRECT reads of unaligned records would return bytes of the wrong offset"),
    dict(name="save-in-place", file="csrc/storage.c",
         edits=[("pw->fd = open(pw->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);",
                 "pw->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);"),
                ("    if (commit && !err && rename(pw->tmp, pw->path) != 0) {",
                 "    if (0) {")],
         tests=["tests/test_storage_atomic.py",
                "tests/test_hardening_faults.py::test_failed_write_leaves_the_old_index"],
         est=45, why="a failed or killed save would destroy the index it was replacing"),
    dict(name="missing-ip-sign", file="csrc/metric.c",
         edits=[('[KD_IP] = {"ip", KD_IP, 1, 0, -1.0f, -INFINITY},',
                 '[KD_IP] = {"ip", KD_IP, 1, 0, -1.0f, INFINITY},')],
         tests=["tests/test_metric_table.py", "tests/test_search_api.py::test_k_larger_than_count_pads"],
         est=40, why="padding slots of an ip search would sort as the best results (+inf similarity)"),
    dict(name="duplicate-id-accepted", file="csrc/index.c",
         edits=[("if (kd_idmap_put(&ix->idmap, id, (uint32_t)(first + put))) {",
                 "if (kd_idmap_put(&ix->idmap, id, (uint32_t)(first + put)) && 0) {")],
         tests=["tests/test_errors.py"],
         est=40, why="two vectors could share an id: results and get_vectors ambiguous"),
    dict(name="progress-cancel-ignored", file="python/knndirect/_index.py",
         edits=[("if report is not None and report(end, n) is False:\n                    break",
                 "if report is not None and report(end, n) is False:\n                    pass")],
         tests=["tests/test_search_api.py::test_progress_cancel_stops_add"],
         est=15, why="a progress callback returning False would not stop a long add"),
    dict(name="default-oversample-halved", file="csrc/index.c",
         edits=[("    if (pdim <= 128)\n        return 20.0;", "    if (pdim <= 128)\n        return 10.0;")],
         tests=["tests/test_read_volume.py", "tests/test_recall.py"],
         est=60, why="the default shortlist would halve for dims <= 128: recall drops"),
    dict(name="stats-reset-ignored", file="csrc/index.c",
         edits=[("dst[i] = reset ? __atomic_exchange_n(&src[i], 0, __ATOMIC_RELAXED)",
                 "dst[i] = reset ? __atomic_load_n(&src[i], __ATOMIC_RELAXED)")],
         tests=["tests/test_read_volume.py::test_stats_reset_returns_then_zeroes"],
         est=35, why="stats(reset=True) would not zero the counters: per-interval figures accumulate"),
    dict(name="result-id-off-by-one", file="csrc/search.c",
         edits=[("            I[i] = ix->ids[top[i].row];", "            I[i] = ix->ids[top[i].row] + 1;")],
         tests=["tests/test_search_api.py::test_k1_finds_itself"],
         est=35, why="every search would name the neighbour's successor id"),
    dict(name="truncated-open-not-named", file="csrc/persist.c",
         edits=[('if (pread(fd, magic, 8, 0) == 8 && memcmp(magic, "KNNDIRCT", 8) == 0) {',
                 "if (0) {")],
         tests=["tests/test_corrupt_index.py::test_truncated_everywhere",
                "tests/test_storage_damage.py::test_truncated_at_every_section_boundary"],
         est=40, why="open() of a truncated index would call it 'not a knndirect index' instead of truncated"),
    dict(name="sort-key-negatives", file="csrc/hnsw.c",
         edits=[("    return u & 0x80000000u ? ~u : u | 0x80000000u;", "    return u | 0x80000000u;")],
         tests=["tests/test_recall.py"],
         est=40, why="beams with negative distances (ip) would come out misordered: recall falls"),
    dict(name="shortlist-pool-edge", file="csrc/hnsw.c",
         edits=[("    uint64_t edge = (uint64_t)lo + ((uint64_t)(b + 1) << shift);",
                 "    uint64_t edge = (uint64_t)lo + ((uint64_t)b << shift);")],
         tests=["tests/test_recall.py::test_a_deep_shortlist_keeps_the_beams_best"],
         est=40, why="a shortlist deeper than the beam would drop the bucket that holds its last rows: recall falls at every default with oversample past ef"),
    dict(name="code-width-edge", file="csrc/quant.c",
         edits=[("version >= KD_FORMAT_WIDE_CODES && 2 * p <= KD_CODE_BITS_WIDE)",
                 "version >= KD_FORMAT_WIDE_CODES && 2 * p < KD_CODE_BITS_WIDE)")],
         tests=["tests/test_code_width.py"],
         est=20, why="256-dimension codes would keep 256 bits: the rule's edge, where the padding pays most"),
    dict(name="estimate-avx512-mask", file="csrc/quant.c",
         edits=[("    return left >= 8 ? (__mmask8)0xff : (__mmask8)((1u << left) - 1);", "    return (void)left, (__mmask8)0xff;")],
         tests=["tests/test_quant_native.py"],
         est=15, why="on AVX-512 CPUs every 1-bit estimate under 512 dimensions would count the code's tail and the next row's bits"),
    dict(name="refine-avx512-lanes", file="csrc/quant.c",
         edits=[("_mm512_fmadd_ps(d16, _mm512_loadu_ps(x + 16), acc1);",
                 "_mm512_fmadd_ps(d16, _mm512_loadu_ps(x + 32), acc1);")],
         tests=["tests/test_quant_native.py"],
         est=15, why="on AVX-512 CPUs refined estimates would pair dimensions 16-31's levels with the query's 32-47"),
    dict(name="layout-ids", file="csrc/index.c",
         edits=[("        size_t i = grouped ? from[put] : put;", "        size_t i = put;")],
         tests=["tests/test_layout.py"],
         est=30, why="rows stored in centre order would carry the ids of the input's order: searches would name the wrong vectors"),
    dict(name="exact-l2-bound-no-slack", file="csrc/exact.c",
         edits=[("    float slack = 4.0f * (float)(d->dim + 8) * 0x1p-24f, lower[KD_PANEL_ROWS];",
                 "    float slack = 0.0f, lower[KD_PANEL_ROWS];")],
         tests=["tests/test_exact_search.py::test_l2_panels_equal_direct_sums"],
         est=25, why="exact l2 batches would trust inner products' rounding: far from the origin true neighbours would be skipped"),
    dict(name="panel-transpose-lanes", file="csrc/distance.c",
         edits=[("        r[4 + c] = _mm512_shuffle_f32x4(lo0, lo1, 0xDD);",
                 "        r[4 + c] = _mm512_shuffle_f32x4(lo0, lo1, 0x88);")],
         tests=["tests/test_kernels.py"],
         est=20, why="on AVX-512 CPUs exact batches would score rows against the wrong dimensions"),
    dict(name="default-bound-one-column", file="python/knndirect/_calibration.py",
         edits=[("        bound = measured - sure_z(len(candidates)) * stderr",
                 "        bound = measured - sure_z(1) * stderr")],
         tests=["tests/test_recall_target.py::test_default_bound_counts_the_columns_it_picks_from"],
         est=5, why="the default would take the cheapest of several columns at one column's confidence: "
                    "8 of 72 builds below 0.95 against 1"),
    dict(name="old-tail-wrong-correction", file="csrc/quant.c",
         edits=[("        t.corr = q->metric == KD_L2 ? f[1] : f[2];",
                 "        t.corr = q->metric == KD_L2 ? f[2] : f[1];")],
         tests=["tests/test_storage_golden.py::test_older_code_tails_convert_byte_for_byte"],
         est=40, why="files of formats 1 to 3 would be searched with the other metric's correction: "
                     "every estimate off by a per-row term"),
    dict(name="neighbour-choice-skips-one", file="csrc/hnsw.c",
         edits=[("        for (size_t j = 0, m; j < kept && good; j += m) {",
                 "        for (size_t j = 0, m; j < kept && good; j += m + (j == 2)) {")],
         tests=["tests/test_neighbour_choice.py::test_choice_is_the_rule"],
         est=40, why="the checks that grow from one kept neighbour to four a pass would skip the "
                     "fifth: candidates it should turn away kept, lists less diverse"),
    dict(name="insertion-order-drops-rows", file="csrc/hnsw.c",
         edits=[("        if (g->levels[first + r] == 0)",
                 "        if (g->levels[first + r] == 0 && r % 50)")],
         tests=["tests/test_insertion_order.py::test_every_row_is_found_from_its_own_vector"],
         est=30, why="one level-0 row in fifty would never be inserted: no in-links, and a search "
                     "could never return it"),
    dict(name="sorted-beam-never-steps-back", file="csrc/hnsw.c",
         edits=[("                next = at < next ? at : next;",
                 "                next = next + 0 * at;")],
         tests=["tests/test_recall.py::test_recall_default_parameters"],
         est=60, why="the beam would never expand a node found nearer than the one it is at: "
                     "a walk that stops early, and recall falls"),
    dict(name="sorted-beam-misplaces", file="csrc/hnsw.c",
         edits=[("    size_t lo = (size_t)(base - r) + (len == 1 && base->dist <= it.dist);",
                 "    size_t lo = (size_t)(base - r);")],
         tests=["tests/test_recall.py::test_recall_default_parameters",
                "tests/test_recall.py::test_reranked_distances_are_true_distances"],
         est=60, why="the beam's results would fall out of order: the wrong ones dropped and the "
                     "wrong ones expanded"),
    dict(name="insertion-order-no-skeleton", file="csrc/index.c",
         edits=[("    if (at)\n        kd_graph_skeleton_first(&ix->graph, first, n, at);",
                 "    if (at && !grouped)\n        kd_graph_skeleton_first(&ix->graph, first, n, at);")],
         tests=["tests/test_insertion_order.py::test_input_sorted_by_cluster_builds_as_good_a_graph",
                "tests/test_insertion_order.py::test_every_row_is_found_from_its_own_vector"],
         est=40, why="input sorted by category, built with 2 threads, would lose about 0.02 of "
                     "recall at ef 16 and leave runs of rows that no search finds"),
]
