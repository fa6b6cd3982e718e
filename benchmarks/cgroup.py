"""A memory cgroup for benchmark children (bench_disk, bench_preload, soak):
cgroup v1 (/sys/fs/cgroup/memory) or v2 (/sys/fs/cgroup), whichever is
mounted, and a sampler of its memory while a child runs. Needs root."""
import os
import threading
import time

V1_ROOT = "/sys/fs/cgroup/memory"
V2_ROOT = "/sys/fs/cgroup"


def _read_words(path):
    with open(path) as f:
        return f.read().split()


def _own_path(controller):
    """This process's group in the hierarchy of `controller` (v1)."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if controller in ctrls.split(","):
                return path
    return "/"


class Cgroup:
    """A memory cgroup the children run in.

    v1: a group nested in this process's own memory group when it can be
    created there, else at the hierarchy's root; limit in
    memory.limit_in_bytes. v2: a group under the root, with "+memory" enabled
    in the root's cgroup.subtree_control; limit in memory.max. Either way the
    limit counts the page cache the children fault in. OSError when no memory
    controller is mounted or no group can be made."""

    def __init__(self, name):
        self.path = None
        if os.path.exists(os.path.join(V1_ROOT, "memory.limit_in_bytes")):
            self.version = 1
            parents = [os.path.join(V1_ROOT, _own_path("memory").lstrip("/")), V1_ROOT]
        elif os.path.exists(os.path.join(V2_ROOT, "cgroup.controllers")) and \
                "memory" in _read_words(os.path.join(V2_ROOT, "cgroup.controllers")):
            self.version = 2
            ctl = os.path.join(V2_ROOT, "cgroup.subtree_control")
            if "memory" not in _read_words(ctl):
                with open(ctl, "w") as f:
                    f.write("+memory")
            parents = [V2_ROOT]
        else:
            raise OSError("no memory cgroup controller is mounted")
        errors = []
        for parent in dict.fromkeys(parents):
            try:
                path = os.path.join(parent, name)
                os.mkdir(path)
                self.path = path
                break
            except OSError as e:
                errors.append(f"{parent}: {e}")
        if self.path is None:
            raise OSError("cannot create a memory cgroup: " + "; ".join(errors))
        if self.version == 1:
            self.limit_file, self.usage_file = "memory.limit_in_bytes", "memory.usage_in_bytes"
            self.peak_file = "memory.max_usage_in_bytes"
        else:
            self.limit_file, self.usage_file, self.peak_file = \
                "memory.max", "memory.current", "memory.peak"

    def _read(self, name):
        with open(os.path.join(self.path, name)) as f:
            return f.read().strip()

    def _write(self, name, value):
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def set_limit(self, nbytes):
        """Limit in bytes; 0 or None lifts it."""
        self._write(self.limit_file, str(int(nbytes)) if nbytes else
                    ("-1" if self.version == 1 else "max"))

    def limit(self):
        v = self._read(self.limit_file)
        return None if v == "max" else int(v)

    def usage(self):
        return int(self._read(self.usage_file))

    def reset_peak(self):
        try:
            self._write(self.peak_file, "0")
            return True
        except OSError:
            return False

    def reset_limit_hits(self):
        """v1 counts the times the limit was hit in memory.failcnt, which can
        be reset; v2's memory.events cannot (stat() reads it as it is)."""
        if self.version == 1:
            self._write("memory.failcnt", "0")

    def peak(self):
        try:
            return int(self._read(self.peak_file))
        except (OSError, ValueError):
            return None

    def _stat(self):
        return dict(line.split() for line in self._read("memory.stat").splitlines())

    def stat(self):
        """(page cache, anonymous memory, times the limit was hit)."""
        st = self._stat()
        if self.version == 1:
            hits = int(self._read("memory.failcnt"))
            return int(st.get("total_cache", st["cache"])), \
                int(st.get("total_rss", st["rss"])), hits
        events = dict(line.split() for line in self._read("memory.events").splitlines())
        return int(st["file"]), int(st["anon"]), int(events.get("max", 0))

    def anon(self):
        """Anonymous memory charged to the group (the processes' own data), as
        bench_preload has always counted it (v1: rss + rss_huge)."""
        st = self._stat()
        if self.version == 1:
            return int(st["rss"]) + int(st.get("rss_huge", 0))
        return int(st["anon"])

    def enter(self):
        """preexec_fn: move the child into the group before it execs."""
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    def remove(self):
        """Remove the group, waiting up to 10 s for its processes to leave."""
        if self.path:
            for _ in range(100):
                try:
                    os.rmdir(self.path)
                    self.path = None
                    return
                except OSError:
                    time.sleep(0.1)


class MemoryWatch:
    """Samples a group's usage while a child runs (every `period` s; the
    page-cache / anonymous split every tenth sample): finish() gives the
    peak, the limit and how often it was hit."""

    def __init__(self, cgroup, period=0.05):
        self.cg, self.period, self.samples = cgroup, period, []
        self.max_cache = self.max_anon = 0
        self.stop = threading.Event()
        self.cg.reset_limit_hits()
        self.peak_reset = self.cg.reset_peak()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        tick = 0
        while not self.stop.is_set():
            try:
                self.samples.append(self.cg.usage())
                if tick % 10 == 0:
                    cache, anon, _ = self.cg.stat()
                    self.max_cache = max(self.max_cache, cache)
                    self.max_anon = max(self.max_anon, anon)
            except OSError:
                pass
            tick += 1
            self.stop.wait(self.period)

    def finish(self):
        self.stop.set()
        self.thread.join()
        cache, anon, hits = self.cg.stat()
        peak = max(self.samples) if self.samples else 0
        kernel_peak = self.cg.peak() if self.peak_reset else None
        return {"limit_bytes": self.cg.limit(), "peak_bytes": max(peak, kernel_peak or 0),
                "peak_sampled_bytes": peak, "max_cache_bytes": self.max_cache,
                "max_anon_bytes": self.max_anon, "end_cache_bytes": cache, "limit_hits": hits}
