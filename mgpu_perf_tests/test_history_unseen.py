"""`mgpu history` on histories not written for it: what a real CI storage and repository hold that a
hand-made history may not. Merges on main (a merged branch's commits off the first-parent line), runs
of commits the repository lacks, dirty runs, runs with no or odd commit_info, another project's run;
two machines in one folder named for neither, one machine's runs split over two folders, a run saved
twice, `--benchmark-save NAME` files beside autosaves; benchmarks added, renamed and removed midway,
parametrised ids with brackets, slashes and escaped unicode, a median of 0; a shallow clone, the wrong
--repo, bad storage paths; an outlier run at HEAD; hosted runners named anew each job.

Every run is written by hand in pytest-benchmark 5's format (the keys `--benchmark-autosave` writes,
copied from a real file), in tmp_path: nothing is timed.

    pytest mgpu_perf_tests/test_history_unseen.py
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
from html import escape
from pathlib import Path

import pytest

from mgpu_perf.history import ChangePoint, HistorySettings, build_history, find_change_points
from mgpu_perf.history.commits import COPY, MERGED, MISSING, OFF_LINE
from mgpu_perf.history.text import point_line
from mgpu_perf.history.verdicts import EXIT_SUSPECTED
from mgpu_perf_tests.commands import mgpu_in_process

ROOT = Path(__file__).resolve().parents[1]
FOLDER = "Linux-CPython-3.11-64bit"
STEP = "bench/test_step.py::test_step[single]"
PARAM = "bench/test_step.py::test_p[a/b-\\xe9[x]]"   # pytest's id of ("a/b", "é[x]"), as it escapes it
ZERO = "bench/test_step.py::test_zero"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def new_repo(repo: Path) -> Path:
    """An empty git repository on branch main."""
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    return repo


def commit(repo: Path, name: str) -> str:
    (repo / f"{name}.txt").write_text(name + "\n")
    git(repo, "add", f"{name}.txt")
    git(repo, "commit", "-q", "-m", name)
    return git(repo, "rev-parse", "HEAD")


def machine_info(node: str, cpu: str, python: str = "3.11.7", cores: int = 2) -> dict:
    """machine_info as pytest-benchmark 5 writes it (py-cpuinfo's cpu record cut to what varies)."""
    return {"node": node, "processor": "", "machine": "x86_64", "python_compiler": "GCC 12.2.0",
            "python_implementation": "CPython", "python_implementation_version": python, "python_version": python,
            "python_build": ["main", "May  9 2026 07:35:25"], "release": "6.18.44", "system": "Linux",
            "cpu": {"python_version": f"{python}.final.0 (64 bit)", "cpuinfo_version_string": "10.1.1", "arch": "X86_64",
                    "bits": 64, "count": cores, "arch_string_raw": "x86_64", "brand_raw": cpu, "flags": ["avx2"]}}


def bench_record(fullname: str, median: float, rounds: int = 20, extra_info: dict | None = None) -> dict:
    record = {"group": None, "name": fullname.split("::")[-1], "fullname": fullname, "params": None, "param": None,
              "options": {"disable_gc": False, "timer": "perf_counter", "min_rounds": 5, "max_time": 1.0,
                          "min_time": 5e-06, "precision": None, "confidence": None, "warmup": False},
              "stats": {"min": median * 0.9, "max": median * 1.2, "mean": median * 1.02, "stddev": median * 0.01,
                        "rounds": rounds, "median": median, "iqr": median * 0.02, "q1": median * 0.99,
                        "q3": median * 1.01, "iqr_outliers": 0, "stddev_outliers": 0, "outliers": "0;0",
                        "ld15iqr": median * 0.9, "hd15iqr": median * 1.2, "ops": 1 / median if median else 0.0,
                        "total": median * rounds, "iterations": 1}}
    if extra_info is not None:  # pytest-benchmark writes {} by default; older files and hand edits lack it
        record["extra_info"] = extra_info
    return record


class Storage:
    """A storage folder written as pytest-benchmark names its files: NNNN_<commit>_<date>_<time>.json
    (autosave) or NNNN_<name>.json (--benchmark-save NAME), numbered per folder."""

    def __init__(self, path: Path):
        self.path, self.numbers, self.saves = path, {}, 0

    def save(self, commit_id, info: dict, benchmarks: list[dict], folder: str = FOLDER, name: str | None = None,
             commit_info: object = "default", dirty: bool = False, project: str = "demo") -> Path:
        self.saves += 1
        stamp = f"2026-10-{1 + self.saves // 1440:02d}T{self.saves // 60 % 24:02d}:{self.saves % 60:02d}:00"
        record = {"machine_info": info, "commit_info": {"id": commit_id, "time": stamp, "author_time": stamp,
                                                        "dirty": dirty, "project": project, "branch": "main"},
                  "benchmarks": benchmarks, "datetime": stamp + "+00:00", "version": "5.3.1"}
        if commit_info != "default":
            record["commit_info"] = commit_info
        if commit_info is None:
            del record["commit_info"]
        number = self.numbers[folder] = self.numbers.get(folder, 0) + 1
        file = self.path / folder / (f"{number:04d}_{name}.json" if name else
                                     f"{number:04d}_{commit_id}_{stamp[:10].replace('-', '')}_{number:06d}.json")
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps(record, indent=4, ensure_ascii=True))
        return file


XEON = machine_info("vm", "Intel(R) Xeon(R) Processor")
EPYC = machine_info("runner-b", "AMD EPYC 7763 64-Core Processor", python="3.12.3", cores=8)


def benchmarks(i: int, scale: float, rng: random.Random) -> list[dict]:
    """Commit i's benchmarks: the step 20 % slower from commit 8; test_new added at 5; test_old renamed
    test_renamed at 10; test_gone removed at 6; a median of 0 s at every third commit."""
    def noisy(seconds):
        return seconds * scale * math.exp(rng.gauss(0, 0.01))
    out = [bench_record(STEP, noisy(0.040 * (1.2 if i >= 8 else 1.0)), extra_info={"devices": 1} if i % 2 else None),
           bench_record(PARAM, noisy(2e-3), extra_info={}),
           bench_record("bench/test_step.py::test_renamed" if i >= 10 else "bench/test_step.py::test_old", noisy(5e-3)),
           bench_record(ZERO, 0.0 if i % 3 == 0 else 1e-8, rounds=1)]
    out += [bench_record("bench/test_step.py::test_new", noisy(1e-3))] if i >= 5 else []
    return out + ([bench_record("bench/test_step.py::test_gone", noisy(7e-3))] if i < 6 else [])


@pytest.fixture
def ci(ci_made, tmp_path):
    """ci_made's repository and storage, copied for the test to change as it likes."""
    made, line, branch, odd = ci_made
    shutil.copytree(made, tmp_path, symlinks=True, dirs_exist_ok=True)
    return tmp_path / "repo", tmp_path / "storage", line, branch, odd


@pytest.fixture(scope="module")
def ci_made(tmp_path_factory):
    """14 first-parent commits, two of them --no-ff merges of a 2-commit branch (at 4 and 9); the Xeon
    times each twice (its first 5 commits in a folder of another name), the EPYC once, in the Xeon's
    folder; the branches' commits, a rebased-away commit, a dirty run, runs with no or odd commit_info,
    another project's run, a run copied into a second folder and a --benchmark-save file beside them.
    Made once for the module (about 65 git commands) and copied by each test that takes `ci`."""
    folder = tmp_path_factory.mktemp("ci")
    repo = new_repo(folder / "repo")
    line, branch = [], []
    for i in range(14):
        if i in (4, 9):
            git(repo, "checkout", "-q", "-b", f"feature{i}")
            branch += [commit(repo, f"feature{i}a"), commit(repo, f"feature{i}b")]
            git(repo, "checkout", "-q", "main")
            git(repo, "merge", "-q", "--no-ff", "-m", f"merge feature{i}", f"feature{i}")
            line.append(git(repo, "rev-parse", "HEAD"))
        else:
            line.append(commit(repo, f"main{i}"))
    git(repo, "checkout", "-q", "-b", "gone")
    gone = commit(repo, "gone")
    git(repo, "checkout", "-q", "main")
    git(repo, "branch", "-q", "-D", "gone")
    git(repo, "reflog", "expire", "--expire=now", "--all")
    git(repo, "gc", "-q", "--prune=now")
    storage, rng = Storage(folder / "storage"), random.Random(5)
    for i, sha in enumerate(line):
        for k in range(2):
            storage.save(sha, XEON, benchmarks(i, 1.0, rng), folder="ci-old" if i < 5 else FOLDER,
                         name="nightly" if (i, k) == (7, 1) else None)
        storage.save(sha, EPYC, benchmarks(i, 0.5, rng))
    copied = storage.path / "copies" / "0001_copy.json"
    copied.parent.mkdir()
    copied.write_text(next((storage.path / FOLDER).glob("0001_*.json")).read_text())
    odd = {"gone": gone, "other": "0123456789abcdef" * 2 + "01234567"}
    for sha in branch:
        storage.save(sha, XEON, benchmarks(3, 1.0, rng))
    storage.save(gone, XEON, benchmarks(3, 1.0, rng))
    storage.save(line[-1], XEON, benchmarks(13, 1.0, rng), dirty=True)
    storage.save(line[-1], XEON, benchmarks(13, 1.0, rng), commit_info=None)
    storage.save(line[-1], XEON, benchmarks(13, 1.0, rng), commit_info="abc")   # not a record: no traceback
    storage.save(odd["other"], XEON, benchmarks(13, 1.0, rng), project="other")
    return folder, line, branch, odd


def settings(storage, repo, **options):
    return HistorySettings.from_values({"storage": storage, "repo": repo, **options})


def history_command(*argv, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m mgpu history ARGV` from `cwd`, in this process (mgpu_perf_tests/commands.py): its exit code,
    stdout and stderr. `python -m mgpu history` as a process of its own: the reader test below."""
    return mgpu_in_process("history", *argv, cwd=cwd)


def test_the_step_is_found_on_each_machine_with_its_range_medians_ratio_and_p(ci):
    repo, storage, line, _, _ = ci
    history = build_history(settings(storage, repo))
    nodes = {dict(m.machine.fields)["node"]: m for m in history.machines}
    assert sorted(nodes) == ["runner-b", "vm"], f"machines: {sorted(nodes)}"
    assert nodes["vm"].runs == 28 and nodes["runner-b"].runs == 14, (
        f"the Xeon's runs of both folders (28, its copy once) and the EPYC's 14: {nodes['vm'].runs}, {nodes['runner-b'].runs}")
    for node, before in (("vm", 0.040), ("runner-b", 0.020)):
        points = {b.benchmark: b.change_points for b in nodes[node].benchmarks}
        found = [(line.index(p.before_commit), line.index(p.after_commit), round(p.ratio, 3)) for p in points[STEP]]
        assert found and found[0][:2] == (7, 8) and len(found) == 1, f"{node}: the 20 % step at commit 8: {found}"
        p = points[STEP][0]
        assert p.commits_between == (line[8],) and 1.15 < p.ratio < 1.25 and p.p_value < 1e-6, f"{node}: {p}"
        assert abs(p.median_before / before - 1) < 0.02 and abs(p.median_after / (1.2 * before) - 1) < 0.02, p
        others = {name: pts for name, pts in points.items() if name != STEP and pts}
        assert not others, f"{node}: benchmarks that never changed have change points: {others}"
        assert PARAM in points and "bench/test_step.py::test_renamed" in points, f"{node}: {sorted(points)}"


def test_each_run_off_the_line_says_why(ci):
    repo, storage, line, branch, odd = ci
    history = build_history(settings(storage, repo))
    why = {(a.run.file.split("/")[0], a.run.commit): a.why for a in history.apart}
    for sha in branch:
        assert why[FOLDER, sha] == MERGED, f"a merged branch's commit {sha[:10]}: {why[FOLDER, sha]!r}"
    assert why[FOLDER, odd["gone"]] == MISSING + "; it names project 'demo'", why[FOLDER, odd["gone"]]
    assert why[FOLDER, odd["other"]] == MISSING + "; it names project 'other'", why[FOLDER, odd["other"]]
    original = f"{FOLDER}/" + next((storage / FOLDER).glob(f"0001_{line[0]}_*")).name
    copies = sorted((a.run.file, a.why) for a in history.apart if a.kind == "copy")
    assert copies in ([(original, COPY.format(file="copies/0001_copy.json"))],
                      [("copies/0001_copy.json", COPY.format(file=original))]), f"a run saved twice: {copies}"
    reasons = sorted(a.why for a in history.apart if a.run.commit in (line[-1], "unknown"))
    assert reasons == ["no commit recorded", "no commit recorded", "uncommitted changes: it timed no commit"], reasons
    assert MERGED.startswith(OFF_LINE) and len(history.apart) == 10, f"{len(history.apart)} apart: {sorted(why.values())}"


def test_text_json_and_page_say_the_same(ci, tmp_path):
    repo, storage, line, _, _ = ci
    done = history_command(storage, "--json", tmp_path / "h.json", "--html", tmp_path / "h.html", cwd=repo)
    assert done.returncode == EXIT_SUSPECTED and "Traceback" not in done.stderr, f"exit {done.returncode}: {done.stderr}"
    record, page = json.loads((tmp_path / "h.json").read_text()), (tmp_path / "h.html").read_text()
    assert len(record["change_points"]) == 2 and record["exit_code"] == done.returncode, record["change_points"]
    for p in record["change_points"]:
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in p.items() if k != "direction"}
        text = point_line(ChangePoint(**fields))
        assert text in done.stdout and escape(text) in page, f"the JSON's point as text is not what stdout/page say: {text}"
        assert p["before_commit"] == line[7] and p["after_commit"] == line[8], p
    assert record["summary"] in done.stdout and f'{len(record["not_placed"])} run(s) with no place' in done.stdout
    assert f"in {record['repo']} (14 commits)" in done.stdout, done.stdout.splitlines()[0]
    zero = [b for m in record["machines"] for b in m["benchmarks"] if b["benchmark"] == ZERO]
    assert [b["unusable_runs"] for b in zero] == [10, 5], f"runs with a median of 0 s: {zero}"
    assert "(10 more with a median of 0 s or none, left out)" in done.stdout, done.stdout


def test_a_benchmark_whose_every_median_is_0_is_listed_not_plotted(tmp_path):
    repo = new_repo(tmp_path / "repo")
    storage = Storage(tmp_path / "storage")
    for i in range(5):
        storage.save(commit(repo, f"c{i}"), XEON, [bench_record(STEP, 0.01), bench_record(ZERO, 0.0, rounds=1)])
    done = history_command(storage.path, "--html", tmp_path / "h.html", cwd=repo)
    assert done.returncode == 0 and f"{ZERO}: 0 run(s) over 0 commit(s) (5 more with a median of 0 s" in done.stdout, (
        done.stdout + done.stderr)
    assert "nothing to plot" in (tmp_path / "h.html").read_text()


def test_the_wrong_repository_is_exit_2_not_no_slowdown(ci, tmp_path):
    _, storage, _, _, _ = ci
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q", "-b", "main")
    commit(other, "unrelated")
    done = history_command(storage, "--repo", other, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == "", f"exit {done.returncode}: {done.stdout}{done.stderr}"
    line = done.stderr.strip()
    assert "\n" not in line and "none of the 52 run(s)" in line and "is --repo the repository" in line, line


def test_a_shallow_clone_is_exit_2_naming_the_fetch(ci, tmp_path):
    repo, storage, _, _, _ = ci
    subprocess.run(["git", "clone", "-q", "--depth", "3", repo.as_uri(), str(tmp_path / "shallow")], check=True)
    done = history_command(storage, "--repo", tmp_path / "shallow", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, f"exit {done.returncode}: {done.stdout}{done.stderr}"
    assert "a shallow clone" in done.stderr and "fetch-depth: 0" in done.stderr, done.stderr


@pytest.mark.parametrize("case, message", [
    ("a file", "a file, not a folder"),
    ("the storage's parent", "saved runs lie deeper: try"),
    ("elasticsearch", "file storage only"),
    ("no repo folder", "--repo"),
    ("unwritable json", "--json: cannot write"),
])
def test_bad_storage_and_paths_are_one_line_and_exit_2(ci, tmp_path, case, message):
    repo, storage, _, _, _ = ci
    (tmp_path / "a.json").write_text("{}")
    argv = {"a file": [tmp_path / "a.json"], "the storage's parent": [tmp_path],
            "elasticsearch": ["elasticsearch+http://localhost:9200/benchmark/benchmark"],
            "no repo folder": [storage, "--repo", tmp_path / "nowhere"],
            "unwritable json": [storage, "--json", tmp_path / "a.json" / "h.json"]}[case]
    done = history_command(*argv, cwd=repo)
    err = done.stderr.strip()
    assert done.returncode == 2 and "\n" not in err and message in err, f"{case}: exit {done.returncode}: {err}"


def test_a_file_url_names_the_storage_as_pytest_benchmark_spells_it(ci):
    repo, storage, _, _, _ = ci
    done = history_command(f"file://{storage}", cwd=repo)
    assert done.returncode == EXIT_SUSPECTED, f"exit {done.returncode}: {done.stderr}"


def test_one_outlier_run_at_head_blames_no_commit():
    """The last commit's one run 3x slower (a burst of load): PELT's last segment spans the last two
    commits, so the commit before HEAD, whose run measured the old level, was named as a 2x step.
    A real 20 % step on those two commits is still found."""
    line = tuple(f"{i:040x}" for i in range(14))
    for seed in range(20):
        rng = random.Random(seed)
        runs = [(i, 0.04 * math.exp(rng.gauss(0, 0.02)) * (3 if i == 13 else 1)) for i in range(14)]
        points = find_change_points(runs, line, STEP, "vm", HistorySettings.from_values())
        assert points == (), f"seed {seed}: an outlier at HEAD made {[(p.after_commit[-2:], p.ratio) for p in points]}"
        steps = [(i, 0.04 * math.exp(rng.gauss(0, 0.02)) * (1.2 if i >= 12 else 1)) for i in range(14)]
        found = [(int(p.after_commit, 16), round(p.ratio, 2)) for p in find_change_points(steps, line, STEP, "vm",
                                                                                          HistorySettings.from_values())]
        assert [i for i, _ in found] == [12], f"seed {seed}: the step at commit 12 of 14: {found}"


def test_hosted_runners_named_anew_each_job_are_said(tmp_path):
    repo = new_repo(tmp_path / "repo")
    storage = Storage(tmp_path / "storage")
    for i in range(6):
        storage.save(commit(repo, f"c{i}"), machine_info(f"fv-az{i}", "AMD EPYC 7763"), [bench_record(STEP, 0.01)])
    history = build_history(settings(storage.path, repo))
    assert len(history.machines) == 6 and len(history.notes) == 1, history.notes
    assert "differ only in their host name" in history.notes[0] and "pytest_benchmark_update_machine_info" in \
        history.notes[0], history.notes
    done = history_command(storage.path, cwd=repo)
    assert history.notes[0] in done.stdout and "too few commits for a change point (4 needed)" in done.stdout, done.stdout


def test_a_reader_that_stops_early_ends_stdout_not_the_command(ci, tmp_path):
    """`mgpu history | head`: the pipe closed before the table is printed was a one-line error with
    exit 2, and the --json file was never written."""
    repo, storage, _, _, _ = ci
    process = subprocess.Popen([sys.executable, "-m", "mgpu", "history", str(storage), "--json", str(tmp_path / "h.json")],
                               cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT), "MGPU_COMMANDS": "mgpu_perf.cli"})
    process.stdout.close()  # before the command has printed anything: its first write finds no reader
    err = process.stderr.read()
    assert process.wait(timeout=120) == EXIT_SUSPECTED and err == "", f"exit {process.returncode}: {err}"
    assert json.loads((tmp_path / "h.json").read_text())["exit_code"] == EXIT_SUSPECTED


# -- --statistic: which of a run's stats stands for it ------------------------------------------------

def test_statistic_min_reads_each_runs_min_and_says_so_and_a_bad_one_is_named():
    """On a shared VM one process's speed can wander within a run: its median then moves by half
    while its min stays. --statistic min reads the stored min (pytest-benchmark keeps it) and the
    table says so; a statistic the storage does not hold is one line naming the option."""
    from mgpu_perf.history.errors import HistoryError
    from mgpu_perf.history.runs import run_of
    from mgpu_perf.history.settings import HistorySettings

    data = {"benchmarks": [{"fullname": "t.py::test_step", "stats": {"median": 0.005, "min": 0.003, "mean": 0.0055}}],
            "commit_info": {"id": "a" * 40}, "machine_info": {"node": "vm"}}
    assert run_of("r.json", data).medians == (("t.py::test_step", 0.005),), "the median by default"
    assert run_of("r.json", data, "min").medians == (("t.py::test_step", 0.003),)
    assert HistorySettings.from_values({"statistic": "MIN"}).statistic == "min"
    with pytest.raises(HistoryError, match=r"--statistic must be one of median, min, mean, got 'p99'"):
        HistorySettings.from_values({"statistic": "p99"})


# -- --since: judge only the steps made after the commit the last run saw ------------------------------

def test_since_lists_an_earlier_step_as_earlier_and_judges_only_what_came_after(tmp_path):
    """A 20 % step at commit 4 of 12. --since commit 8 (the job's last run saw it): the step is
    listed `earlier` and exit 0; --since commit 2: it is judged, exit 4. A ref git does not know,
    or one off the first-parent line, is one line naming --since, exit 2."""
    repo = new_repo(tmp_path / "repo")
    storage = Storage(tmp_path / "storage")
    rng = random.Random(5)
    line = []
    for i in range(12):
        line.append(commit(repo, f"c{i}"))
        for _ in range(2):
            seconds = 0.040 * (1.2 if i >= 4 else 1.0) * math.exp(rng.gauss(0, 0.01))
            storage.save(line[-1], XEON, [bench_record(STEP, seconds)])
    judged = history_command(storage.path, "--since", line[2], cwd=repo)
    assert judged.returncode == 4 and "suspected   slower" in judged.stdout, judged.stdout + judged.stderr
    later = history_command(storage.path, "--since", line[8], "--json", tmp_path / "h.json", cwd=repo)
    assert later.returncode == 0, later.stdout + later.stderr
    assert "earlier     slower" in later.stdout and "1 earlier than --since, not judged" in later.stdout, later.stdout
    record = json.loads((tmp_path / "h.json").read_text())
    assert [p["verdict"] for p in record["change_points"]] == ["earlier"], record["change_points"]
    for ref, said in (("nosuch", "--since nosuch: no such commit"), ("-x", "--since must name a commit")):
        bad = history_command(storage.path, f"--since={ref}", cwd=repo)  # `=`: argparse lets -x through to git
        assert bad.returncode == 2 and said in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    git(repo, "checkout", "-q", "-b", "side", line[5])
    side = commit(repo, "side")
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    off = history_command(storage.path, "--since", side, cwd=repo)
    assert off.returncode == 2 and "is not on HEAD's first-parent line" in off.stderr, off.stderr
