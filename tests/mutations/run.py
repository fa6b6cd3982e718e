#!/usr/bin/env python3
"""Mutation audit: break the code on purpose, one mutation at a time, and
check that the tests named for each mutation fail.

    python tests/mutations/run.py            # the whole list (5 to 7 min)
    python tests/mutations/run.py --list     # the list, with the anchors' state
    python tests/mutations/run.py --only gil-add,early-reads-off

The mutations are in tests/mutations/mutations.py. The run works on a copy
of the tracked files of this tree (as they are on disk, uncommitted edits
included), made once in a temporary directory; the tree itself is never
edited. In the copy: build the extension, run every named test once
unmutated (a failure there makes the run invalid: exit 2), then for each
mutation edit its file, rebuild when C changed, run its tests with
`-x -q -p no:cacheprovider` under a timeout, and put the file (and the
clean extension) back.

Verdicts: caught (a named test failed, crashed or timed out), missed (they
all passed), stale (an anchor is not found exactly once: the code moved),
error (the build failed, or pytest could not run the tests). Exit status
0 only when every mutation is caught. A full run (no --only) writes
tests/mutations/RESULTS.md; the notes below its `<!-- notes -->` line are
written by hand and kept from one run to the next.
"""
import argparse
import datetime
import glob
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "RESULTS.md")
NOTES_MARK = "<!-- notes -->"
BUILD = [sys.executable, "setup.py", "-q", "build_ext", "--inplace", "--force"]
PYTEST = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]

sys.path.insert(0, HERE)
from mutations import MUTATIONS  # noqa: E402


def log(msg=""):
    print(msg, flush=True)


def fmt_secs(s):
    s = int(round(s))
    return "%d:%02d" % (s // 60, s % 60) if s >= 60 else "%d s" % s


def git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def anchors(m, text):
    """None when every original occurs exactly once in text, else why not."""
    for i, (old, _new) in enumerate(m["edits"]):
        n = text.count(old)
        if n != 1:
            return "edit %d: anchor found %d times" % (i + 1, n)
    return None


def last_seconds():
    """Seconds per mutation from the last RESULTS.md, where there is one."""
    out = {}
    try:
        with open(RESULTS) as f:
            for line in f:
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if len(cells) >= 6 and cells[3] in ("caught", "missed", "stale", "error"):
                    try:
                        out[cells[0].strip("`")] = float(cells[4])
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


def make_copy(dest):
    """Copy the tracked files of the tree (as on disk) to dest."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for rel in files:
        if not rel:
            continue
        src = os.path.join(ROOT, rel)
        if not os.path.lexists(src) or os.path.isdir(src):
            continue   # deleted in the tree, or a submodule
        dst = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)


def run(cmd, cwd, env, timeout):
    """(returncode, seconds, output tail); returncode 124 on timeout."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout,
                           start_new_session=True)
        rc, out = p.returncode, p.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        rc, out = 124, (e.stdout or b"").decode(errors="replace")
    return rc, time.monotonic() - t0, out[-3000:]


def core_libs(copy):
    return glob.glob(os.path.join(copy, "python", "knndirect", "_core*.so"))


def pytest_verdict(rc, out):
    """caught / missed / error from pytest's exit status."""
    if rc == 0:
        return "missed", ""
    if rc == 1:
        failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)
        return "caught", (failed[0] if failed else "a test failed")
    if rc == 124:
        return "caught", "timed out (a test hung)"
    if rc < 0:
        return "caught", "pytest killed by signal %d (a crash)" % -rc
    return "error", "pytest exit status %d (collection or usage error)" % rc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--only", metavar="NAME[,NAME]", help="run only these mutations")
    ap.add_argument("--jobs", type=int, default=1,
                    help="mutations at a time (only 1 is supported: builds are CPU heavy)")
    ap.add_argument("--keep", action="store_true", help="leave the copy for inspection")
    ap.add_argument("--timeout", type=int, default=600,
                    help="seconds for one mutation's tests (default 600)")
    ap.add_argument("--results", metavar="PATH",
                    help="write the table here (default: RESULTS.md on a full run only)")
    args = ap.parse_args()
    if args.jobs != 1:
        ap.error("--jobs: only 1 is supported (each mutation rebuilds the extension)")

    names = [m["name"] for m in MUTATIONS]
    assert len(set(names)) == len(names), "duplicate mutation names"
    chosen = MUTATIONS
    if args.only:
        want = [w.strip() for w in args.only.split(",") if w.strip()]
        unknown = [w for w in want if w not in names]
        if unknown:
            ap.error("unknown mutation(s): %s (see --list)" % ", ".join(unknown))
        chosen = [m for m in MUTATIONS if m["name"] in want]

    if args.list:
        for m in chosen:
            with open(os.path.join(ROOT, m["file"])) as f:
                state = anchors(m, f.read()) or "ok"
            log("%-28s %-28s %-6s %s" % (m["name"], m["file"], "ok" if state == "ok" else "STALE",
                                         m["why"]))
            for t in m["tests"]:
                log("%28s   %s" % ("", t))
        log("%d mutations" % len(chosen))
        return 0

    before = last_seconds()
    # the first build and the baseline: about 2 minutes for the whole list
    estimate = sum(before.get(m["name"], m["est"]) for m in chosen) + 30 + 4 * len(chosen)
    commit = git("rev-parse", "--short", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    log("mutation audit of %s%s: %d mutations, estimated %s (%s)" % (
        commit, " + uncommitted changes" if dirty else "", len(chosen), fmt_secs(estimate),
        "last RESULTS.md" if before else "per-mutation estimates"))
    t_start = time.monotonic()

    copy = tempfile.mkdtemp(prefix="knndirect-mut-")
    rows = []
    status = 1
    try:
        make_copy(copy)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.path.join(copy, "python") + (
            os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.pop("PYTEST_ADDOPTS", None)

        log("copy: %s; building the unmutated extension" % copy)
        rc, secs, out = run(BUILD, copy, env, 900)
        if rc != 0:
            log(out)
            log("INVALID: the unmutated copy does not build")
            return 2
        probe = subprocess.run(
            [sys.executable, "-c", "import knndirect; print(knndirect.__file__)"],
            cwd=copy, env=env, capture_output=True, text=True)
        if not probe.stdout.strip().startswith(os.path.join(copy, "python")):
            log("INVALID: `import knndirect` does not load the copy: %r %s" % (
                probe.stdout.strip(), probe.stderr[-500:]))
            return 2
        clean = {}
        for so in core_libs(copy):
            with open(so, "rb") as f:
                clean[so] = f.read()

        tests = []
        for m in chosen:
            for t in m["tests"]:
                if t not in tests:
                    tests.append(t)
        log("baseline: %d test ids on the unmutated copy" % len(tests))
        rc, secs, out = run(PYTEST + tests, copy, env, args.timeout * 3)
        if rc != 0:
            log(out)
            log("INVALID: the named tests fail unmutated (exit status %d after %s); "
                "fix them before auditing" % (rc, fmt_secs(secs)))
            return 2
        log("baseline passed in %s" % fmt_secs(secs))

        for i, m in enumerate(chosen, 1):
            path = os.path.join(copy, m["file"])
            t0 = time.monotonic()
            with open(path) as f:
                original = f.read()
            stat = os.stat(path)
            why_stale = anchors(m, original)
            verdict, detail = None, ""
            if why_stale:
                verdict, detail = "stale", why_stale
            else:
                text = original
                for old, new in m["edits"]:
                    text = text.replace(old, new)
                is_c = not m["file"].endswith(".py")
                try:
                    with open(path, "w") as f:
                        f.write(text)
                    if is_c:
                        rc, _, out = run(BUILD, copy, env, 900)
                        if rc != 0:
                            err = [ln for ln in out.splitlines() if "error" in ln]
                            verdict = "error"
                            detail = "build failed: " + (err[0] if err else out[-200:])
                    if verdict is None:
                        rc, _, out = run(PYTEST + m["tests"], copy, env, args.timeout)
                        verdict, detail = pytest_verdict(rc, out)
                finally:
                    with open(path, "w") as f:
                        f.write(original)
                    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
                    if is_c:   # the unmutated extension back, without a build
                        for so, data in clean.items():
                            with open(so, "wb") as f:
                                f.write(data)
            secs = time.monotonic() - t0
            rows.append((m, verdict, detail, secs))
            log("[%d/%d] %-28s %-7s %5.0f s  %s" % (i, len(chosen), m["name"], verdict, secs,
                                                     detail))

        total = time.monotonic() - t_start
        caught = sum(1 for r in rows if r[1] == "caught")
        table = render_table(rows)
        log("")
        log(table)
        log("%d caught of %d; total %s (estimated %s)" % (caught, len(rows), fmt_secs(total),
                                                        fmt_secs(estimate)))
        target = args.results or (None if args.only else RESULTS)
        if target:
            write_results(target, rows, commit, dirty, total, caught)
            log("wrote %s" % os.path.relpath(target, ROOT))
        status = 0 if caught == len(rows) else 1
        return status
    finally:
        if args.keep:
            log("copy kept: %s" % copy)
        else:
            shutil.rmtree(copy, ignore_errors=True)


def render_table(rows):
    out = ["| mutation | file | tests | verdict | seconds | detail |",
           "| --- | --- | --- | --- | --- | --- |"]
    for m, verdict, detail, secs in rows:
        tests = "<br>".join("`%s`" % t.replace("tests/", "", 1) for t in m["tests"])
        out.append("| `%s` | `%s` | %s | %s | %.0f | %s |" % (
            m["name"], m["file"], tests, verdict, secs, detail.replace("|", "\\|")))
    return "\n".join(out)


def write_results(target, rows, commit, dirty, total, caught):
    notes = ""
    if os.path.exists(target):
        with open(target) as f:
            old = f.read()
        if NOTES_MARK in old:
            notes = old.split(NOTES_MARK, 1)[1].lstrip("\n")
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    lines = [
        "# Mutation audit: results",
        "",
        "Written by `python tests/mutations/run.py` (a full run); the mutations "
        "are in [mutations.py](mutations.py), how to run them in [README.md](README.md).",
        "",
        "- date: %s" % now,
        "- commit: %s%s" % (commit, " + uncommitted changes" if dirty else ""),
        "- command: `python tests/mutations/run.py`",
        "- machine: %s, %d CPUs (%s), Python %s" % (platform.platform(), os.cpu_count() or 0,
                                                     cpu or platform.machine(),
                                                     platform.python_version()),
        "- result: **%d caught of %d**; total %s" % (caught, len(rows), fmt_secs(total)),
        "",
        render_table(rows),
        "",
        NOTES_MARK,
        "",
    ]
    with open(target, "w") as f:
        f.write("\n".join(lines) + notes)


if __name__ == "__main__":
    sys.exit(main())
