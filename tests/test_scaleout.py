"""Scale-out: xdist workers spread over the GPUs of one runner (--gpus), the --shard I/N split
of a CI matrix, and the merge of the shards' audits into one report and one baseline gate.
All on the CPU: the GPU mapping through pure functions and a fake 3-GPU machine."""
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections import Counter

import pytest

from harness import audit, baseline as bl, gpus, shards
from harness.cases import Case
from harness.merge_audits import merge
from harness.plugin import ROOT


def _pytest(*args, cwd=ROOT, env=None, drop=()):
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS", *drop):
        full_env.pop(name, None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


# --- which GPU each worker runs on ------------------------------------------------------------

def test_workers_are_dealt_round_robin_and_share_the_gpus_evenly():
    assert gpus.plan(3, ["0", "2"]) == {"gw0": "0", "gw1": "2", "gw2": "0"}
    assert Counter(gpus.plan(32, ["0", "1"]).values()) == {"0": 16, "1": 16}      # -n auto on 32 cores, 2 GPUs
    assert gpus.plan(2, ["0", "1", "2", "3"]) == {"gw0": "0", "gw1": "1"}           # fewer workers than GPUs
    for n_gpus in range(1, 9):
        ids = [str(i) for i in range(n_gpus)]
        for workers in range(1, 40):
            counts = Counter(gpus.plan(workers, ids).values())
            assert max(counts.values()) - min(counts.values(), default=0) <= 1
            assert len(counts) == min(workers, n_gpus)
    assert gpus.assign(5, 4, ["0", "1"]) == "1"          # a replacement worker (gw5 of 4) still gets a GPU
    assert gpus.worker_index("gw12") == 12
    for bad in (lambda: gpus.assign(0, 1, []), lambda: gpus.worker_index("main"), lambda: gpus.assign(-1, 2, ["0"])):
        with pytest.raises(gpus.GpuError):
            bad()


def test_the_workers_on_one_gpu_keep_at_most_half_its_memory_cached_between_tests():
    """Sixteen workers' caches filled an 80 GB H100 after six minutes of the gpu profile; each now
    keeps at most its share of half the card (harness/plugin.py: pytest_runtest_teardown)."""
    plan = gpus.plan(16, ["0"])
    assert gpus.sharers(plan, "0") == 16 and gpus.sharers(gpus.plan(32, ["0", "1"]), "1") == 16
    h100 = 81559 * 2**20
    assert gpus.cache_limit(h100, 16) == h100 // 32
    assert gpus.cache_limit(h100, 1) == h100 // 2 and gpus.cache_limit(h100, 0) == h100 // 2


def test_large_memory_tests_take_turns_per_gpu_and_the_others_see_one_wanted(tmp_path):
    """One turn per (run, GPU): a second worker's take() blocks until the first gives it back;
    the 'wanted' flag is up while a turn is held or waited for, so the other workers give their
    cached memory back; another GPU, or another run, has its own turn."""
    first, second = gpus.MemoryTurns(tmp_path, "run1", "0"), gpus.MemoryTurns(tmp_path, "run1", "0")
    other_gpu, other_run = gpus.MemoryTurns(tmp_path, "run1", "1"), gpus.MemoryTurns(tmp_path, "run2", "0")
    assert not first.wanted()
    first.take()
    assert first.held and second.wanted() and not other_gpu.wanted() and not other_run.wanted()
    other_gpu.take()                                 # not blocked: another GPU
    other_gpu.give_back()
    got = threading.Event()
    waiter = threading.Thread(target=lambda: (second.take(), got.set()))
    waiter.start()
    assert not got.wait(0.3), "a second worker took the GPU's turn while the first held it"
    first.give_back()
    assert got.wait(10) and second.held and first.wanted()     # the waiter took it, and wants it
    second.give_back()
    waiter.join()
    assert not first.wanted() and not second.held
    assert gpus.MemoryTurns(tmp_path, "r", "MIG-GPU-aa/1/0").lock_path.parent == tmp_path


def test_waiting_for_free_memory_stops_when_it_is_free_or_at_the_timeout():
    free = iter([1, 2, 5, 9])
    assert gpus.wait_for_free(lambda: next(free), 5, timeout_s=10, poll_s=0) < 1
    assert 0.2 <= gpus.wait_for_free(lambda: 0, 5, timeout_s=0.2, poll_s=0.05) < 2


def test_the_gpus_option_picks_among_the_gpus_cuda_visible_devices_leaves():
    assert gpus.parse("0,2") == [0, 2] and gpus.parse(" 1 ") == [1]
    for bad in ("", "a", "0,-1", "0,,1", "1,1", "0.5"):
        with pytest.raises(gpus.GpuError, match="--gpus"):
            gpus.parse(bad)
    assert gpus.restrict([0, 2], None) == ["0", "2"]                  # unset: physical indices
    assert gpus.restrict([1], "2,3") == ["3"]                         # index 1 of the GPUs left visible
    assert gpus.restrict([0], "GPU-aa11, GPU-bb22") == ["GPU-aa11"]
    with pytest.raises(gpus.GpuError, match="leaves 2 GPU"):
        gpus.restrict([2], "2,3")
    assert gpus.visible(None) is None and gpus.visible("") == [] and gpus.visible("4, 5") == ["4", "5"]
    assert gpus.identity(0, "H", "3") == {"index": 3, "name": "H"}   # a pinned worker: its one device is GPU 3
    assert gpus.identity(1, "H", None) == {"index": 1, "name": "H"}
    assert gpus.identity(0, "H", "GPU-aa11") == {"index": "GPU-aa11", "name": "H"}
    lines = gpus.plan_lines(gpus.plan(3, ["0", "2"]), {"0": "H", "2": "H"})
    assert lines[1:] == ["kernelcheck: GPU 0 (H) <- 2 workers: gw0 gw2", "kernelcheck: GPU 2 (H) <- 1 workers: gw1"]


def test_audit_records_name_their_gpu_and_nothing_changes_without_one(backend, budgets):
    from harness.run import run_case
    outcome = run_case(Case.make("rmsnorm", "float32", (3, 5)), backend, budgets)
    on = dataclasses.replace(outcome, backend=dataclasses.replace(backend, gpu={"index": 1, "name": "NVIDIA H200"}))
    off = dataclasses.replace(outcome, backend=dataclasses.replace(backend, gpu=None))
    rec = audit.make_record(on, on.checks[0], "t::x")
    assert rec["gpu"] == {"index": 1, "name": "NVIDIA H200"}
    assert "gpu" not in audit.make_record(off, off.checks[0], "t::x")           # the interpreter's records
    # the summary, the case groups and the merge do not look at it
    plain = {k: v for k, v in rec.items() if k != "gpu"}
    assert audit.summarize([rec]) == audit.summarize([plain]) and bl.group_rows([rec]) == bl.group_rows([plain])


# A machine of three CUDA GPUs as torch.cuda shows it: CUDA_VISIBLE_DEVICES is read once, at the
# first call, as CUDA does; each process writes down what it saw then.
FAKE_CUDA = textwrap.dedent('''
    import json, os
    import torch
    _seen = None
    def _init():
        global _seen
        if _seen is None:
            env = os.environ.get("CUDA_VISIBLE_DEVICES")
            _seen = []
            for token in (["0", "1", "2"] if env is None else env.split(",")):
                if token.strip() not in ("0", "1", "2"):
                    break                       # CUDA stops at the first unknown device
                _seen.append(token.strip())
            name = os.environ.get("PYTEST_XDIST_WORKER", "controller")
            with open(os.path.join(os.environ["FAKE_CUDA_LOG"], f"init-{name}.json"), "w") as f:
                json.dump({"env": env, "devices": _seen}, f)
        return _seen
    torch.cuda.is_available = lambda: bool(_init())
    torch.cuda.device_count = lambda: len(_init())
    torch.cuda.current_device = lambda: (_init(), 0)[1]
    torch.cuda.get_device_name = lambda device=None: (_init(), "Fake GPU")[1]
''')

WHERE = textwrap.dedent('''
    import json, os
    import pytest
    @pytest.mark.parametrize("i", range(6))
    def test_where(i, backend):
        name = os.environ["PYTEST_XDIST_WORKER"]
        with open(os.path.join(os.environ["FAKE_CUDA_LOG"], f"test-{i}.json"), "w") as f:
            json.dump({"worker": name, "env": os.environ["CUDA_VISIBLE_DEVICES"], "gpu": backend.gpu}, f)
''')


def test_a_fake_three_gpu_machine_pins_each_worker_before_cuda_starts(tmp_path):
    (tmp_path / "fakecuda.py").write_text(FAKE_CUDA)
    (tmp_path / "test_where.py").write_text(WHERE)
    log = tmp_path / "log"
    log.mkdir()
    rc, out = _pytest("-p", "harness.plugin", "-p", "fakecuda", "-n", "3", "--gpus", "0,2", "test_where.py",
                      cwd=tmp_path, env={"PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
                                         "FAKE_CUDA_LOG": str(log)},
                      drop=("CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET"))
    assert rc == 0, out
    assert "backend gpu:Fake GPU" in out
    assert "kernelcheck: GPU 0 (Fake GPU) <- 2 workers: gw0 gw2" in out, out
    assert "kernelcheck: GPU 2 (Fake GPU) <- 1 workers: gw1" in out
    seen = {p.stem.removeprefix("init-"): json.loads(p.read_text()) for p in log.glob("init-*.json")}
    # when CUDA first started in each process: the controller restricted to --gpus, each worker to its GPU
    assert seen == {"controller": {"env": "0,2", "devices": ["0", "2"]}, "gw0": {"env": "0", "devices": ["0"]},
                    "gw1": {"env": "2", "devices": ["2"]}, "gw2": {"env": "0", "devices": ["0"]}}
    ran = [json.loads(p.read_text()) for p in log.glob("test-*.json")]
    assert len(ran) == 6
    for r in ran:
        assert r["gpu"] == {"index": int(r["env"]), "name": "Fake GPU"}
        assert r["env"] == {"gw0": "0", "gw1": "2", "gw2": "0"}[r["worker"]]


# --- --shard I/N ------------------------------------------------------------------------------

IDS = [f"tests/test_ops.py::test_pinned[rmsnorm-float32-{r}x{c}-contiguous-normal-s{c}]"
       for r in range(1, 20) for c in range(1, 60)] + [f"tests/test_x.py::test_{i}" for i in range(50)]


def test_every_test_lands_in_exactly_one_shard():
    for count in range(1, 7):
        parts = [shards.split(IDS, i, count) for i in range(1, count + 1)]
        assert sorted(sum(parts, [])) == sorted(IDS)                   # union = all, no test twice
        assert all(abs(len(p) - len(IDS) / count) < 0.15 * len(IDS) / count for p in parts)   # roughly balanced
        assert sum(shards.info(IDS, i, count)["selected"] for i in range(1, count + 1)) == len(IDS)
    # the split and the digest do not depend on the order of collection
    assert shards.split(IDS[::-1], 2, 3) == shards.split(IDS, 2, 3)[::-1]
    assert shards.collection_digest(IDS[::-1]) == shards.collection_digest(IDS) != shards.collection_digest(IDS[1:])


def test_the_split_is_a_fixed_function_of_the_test_id():
    """sha256 of the id, the same on every machine and Python: pinned values, so a change of the
    rule (which would move tests between a CI matrix's shards) shows up here."""
    assert [shards.shard_of(i, 3) for i in ("a", "tests/test_ops.py::test_random[rmsnorm-float32-auto]", IDS[0])] \
        == [2, 2, 3]
    assert shards.collection_digest(["a", "b"]).startswith("911169dd")
    code = ("import json, sys; from harness import shards; "
            "print(json.dumps([shards.shard_of(i, 5) for i in json.load(sys.stdin)]))")
    mine = [shards.shard_of(i, 5) for i in IDS]
    for seed in ("0", "4242"):                 # Python's own hash() would differ between these
        proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(IDS), capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": seed}, check=True)
        assert json.loads(proc.stdout) == mine


def test_shard_option_usage():
    assert shards.parse("2/3") == (2, 3) and shards.parse("1/1") == (1, 1)
    for bad in ("0/3", "4/3", "3", "a/b", "1/0", "-1/2", "1/2/3", ""):
        with pytest.raises(shards.ShardError, match="expected I/N"):
            shards.parse(bad)


def test_collect_only_shards_partition_the_collection():
    """Three collect-only runs of a CI matrix (each with another PYTHONHASHSEED): every test id in
    exactly one shard, the union the whole collection; then a bad --shard is a usage error."""
    selection = ("tests/test_gate.py", "tests/test_ledger.py")
    got, totals = [], set()
    for index in (1, 2, 3):
        rc, out = _pytest("--collect-only", "-q", *selection, f"--shard={index}/3", env={"PYTHONHASHSEED": str(index)})
        assert rc == 0, out
        ids = [line for line in out.splitlines() if "::" in line and not line.startswith(" ")]
        assert ids == shards.split(ids, index, 3) and ids
        got.append(ids)
        tail = next(line for line in out.splitlines() if "tests collected" in line)    # "7/40 tests collected ..."
        totals.add(int(tail.split("/")[1].split()[0]))
        assert int(tail.split("/")[0]) == len(ids)
    everything = sum(got, [])
    assert len(totals) == 1 and len(everything) == len(set(everything)) == totals.pop()
    rc, out = _pytest("--collect-only", "-q", *selection, "--shard", "4/3")
    assert rc == 4 and "--shard 4/3: expected I/N" in out, out


# --- merging the shards ------------------------------------------------------------------------

def _doc(index, count, records, *, digest="d1", collected=4, selected=2, exitstatus=0):
    meta = {"backend": "interpreter", "device": "cpu", "profile": "ci", "versions": {"triton": "3.9"},
            "args": [f"--shard={index}/{count}"], "exitstatus": exitstatus, "gap_hits": {"g": 1},
            "selection": {"filters": [], "stopped": False, "ran": [["t::a", "rmsnorm", "float32", "auto", None]]}}
    if index is not None:
        meta["shard"] = {"index": index, "count": count, "collected": collected, "collected_digest": digest,
                         "selected": selected}
    return {"meta": meta, "records": records}


def _rec(test, gpu=None):
    r = {"test": test, "case": test, "output": "y", "op": "rmsnorm", "dtype": "float32", "usage": 0.5, "passed": True,
         "max_abs_err": 1e-7, "max_rel_err": 1e-7, "atol": 1e-6, "rtol": 1e-6, "ref_ratio": None, "gap": None,
         "config": "auto", "values": "normal"}
    return r if gpu is None else {**r, "gpu": {"index": gpu, "name": "H"}}


def test_merge_refuses_gaps_and_duplicates_and_names_the_files():
    one, two = _doc(1, 2, [_rec("t::a", gpu=0), _rec("t::b", gpu=1)]), _doc(2, 2, [_rec("t::c"), _rec("t::d")])
    records, meta = merge([one, two], ["s1.json", "s2.json"])
    assert len(records) == 4 and meta["shards"] == {"count": 2, "collected": 4, "collected_digest": "d1"}
    assert [p["shard"]["index"] for p in meta["parts"]] == [1, 2] and meta["gap_hits"] == {"g": 2}
    assert meta["selection"]["filters"] == [] and len(meta["selection"]["ran"]) == 1
    refused = {
        "missing shard(s) 2/2": [one],
        "missing shard(s) 2/3": [_doc(1, 3, []), _doc(3, 3, [])],
        "shard 1/2 is given twice (s1.json and s2.json)": [one, one],
        "shards of different splits": [one, _doc(2, 3, [])],
        "shards of different collections": [one, _doc(2, 2, [], digest="d2")],
        "s2.json is not a shard": [one, _doc(None, None, [])],
        "did not record what it collected": [one, _doc(2, 2, [], digest=None)],
        "selected 3 tests in all, but each collected 4": [one, _doc(2, 2, [], selected=1)],
        "a check ran twice": [one, _doc(2, 2, [_rec("t::a")])],
    }
    for message, docs in refused.items():
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            merge(docs, ["s1.json", "s2.json", "s3.json"][:len(docs)])
    # parts of another split (--op groups) merge as before
    records, meta = merge([_doc(None, None, [_rec("t::a")]), _doc(None, None, [_rec("t::b")])])
    assert len(records) == 2 and "shards" not in meta


def _merge_cli(*args):
    proc = subprocess.run([sys.executable, "-m", "harness.merge_audits", *map(str, args)], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


# rmsnorm fp32, the pinned cases of one shape: 10 tests, 10 case groups.
SELECTION = ("--op", "rmsnorm", "--dtype", "float32", "-k", "pinned and 4x129", "tests/test_ops.py")


def test_two_shards_merge_into_one_report_and_one_baseline_gate(tmp_path):
    s1, s2, base1, base = (tmp_path / n for n in ("s1.json", "s2.json", "base1.json", "base.json"))
    rc, out = _pytest(*SELECTION, "--shard=1/2", f"--audit-json={s1}")
    assert rc == 0, out
    # A baseline of shard 1's groups only; shard 2 (under xdist: its workers collect, the controller
    # writes the audit) gates against it in-run: deferred to the merge.
    bl.from_audit(s1, base1)
    rc, out = _pytest(*SELECTION, "--shard=2/2", f"--audit-json={s2}", f"--baseline={base1}", "-n", "2")  # as CI runs
    assert rc == 0, out
    assert "sharded run (2/2): the baseline gate is deferred to the merge of all 2 shards' audits" in out
    assert "groups compared" not in out
    first, second = (json.loads(p.read_text()) for p in (s1, s2))
    assert first["meta"]["shard"]["collected"] == second["meta"]["shard"]["collected"] == 10
    assert first["meta"]["shard"]["selected"] + second["meta"]["shard"]["selected"] == 10
    assert min(len(first["records"]), len(second["records"])) > 0

    merged = tmp_path / "merged.json"
    rc, out = _merge_cli(s1, s2, "-o", merged, "--baseline", base, "--update-baseline")
    assert rc == 0 and f"baseline written to {base}: 10 case groups" in out, out
    assert len(json.loads(merged.read_text())["records"]) == 10
    rc, out = _merge_cli(s1, s2, "--baseline", base)
    assert rc == 0 and "baseline gate passed" in out and "10 groups compared" in out, out

    # A regression planted in the baseline (the group's error now 3x what it was): exit 6.
    doc = json.loads(base.read_text())
    worst = max(doc["groups"], key=lambda g: g["usage"])
    assert worst["usage"] > 0.05
    worst["usage"] = worst["usage"] / 3
    bl.write(base, doc["meta"], {tuple(r[k] for k in bl.KEY): r for r in doc["groups"]})
    rc, out = _merge_cli(s2, s1, "--baseline", base)
    assert rc == bl.EXIT_REGRESSION, out
    grew = [line.split()[:5] for line in out.splitlines() if line.startswith("GREW")]
    assert grew == [["GREW", "rmsnorm", "float32", "pinned", f"{worst['config']}/{worst['values']}"]], out
    assert "exit 6: every test passed, but the baseline gate failed" in out
    # Another backend's baseline: exit 4. A missing or repeated shard: refused, exit 2.
    other = "interpreter" if doc["meta"]["backend"] != "interpreter" else "gpu:NVIDIA H200"   # not this run's
    doc["meta"].update(backend=other, profile="gpu")
    bl.write(base, doc["meta"], {tuple(r[k] for k in bl.KEY): r for r in doc["groups"]})
    rc, out = _merge_cli(s1, s2, "--baseline", base)
    assert rc == 4 and f"written on backend '{other}'" in out, out
    rc, out = _merge_cli(s1, "--baseline", base)
    assert rc == 2 and "missing shard(s) 2/2" in out, out
    rc, out = _merge_cli(s1, s2, s2)
    assert rc == 2 and "shard 2/2 is given twice" in out, out


def test_an_empty_shard_passes_and_a_shard_without_collection_info_is_marked():
    """A shard that none of the selected tests fell in exits 0, not pytest's 5 ("nothing
    collected"); an xdist shard whose workers reported no (or disagreeing) collection info is
    written so that the merge refuses it."""
    from types import SimpleNamespace

    from harness import backend as backends
    from harness.plugin import Recorder, State
    config = SimpleNamespace(getoption=lambda name, default=None: default)
    backend = backends.Backend("interpreter", "cpu", "Triton interpreter (CPU)", {})
    st = State(backend, None, "ci", 0, shard=(3, 3))
    st.shard_info = shards.info(["t::a"], 3, 3)
    assert st.shard_info["selected"] == 0 and st.shard_info["collected"] == 1
    session = SimpleNamespace(exitstatus=pytest.ExitCode.NO_TESTS_COLLECTED)
    Recorder(config, st)._finish_shard(session)
    assert session.exitstatus == pytest.ExitCode.OK
    st = State(backend, None, "ci", 0, shard=(1, 2), worker_shard_infos=[shards.info(["t::a"], 1, 2),
                                                                        shards.info(["t::b"], 1, 2)])
    Recorder(config, st)._finish_shard(session)
    assert st.shard_info["collected_digest"] is None
    with pytest.raises(shards.ShardError, match="did not record what it collected"):
        shards.check([st.shard_info, shards.info(["t::a"], 2, 2)], ["s1.json", "s2.json"])
    empty = State(backend, None, "ci", 0, shard=(1, 2))
    nothing = SimpleNamespace(exitstatus=pytest.ExitCode.NO_TESTS_COLLECTED)
    Recorder(config, empty)._finish_shard(nothing)          # no worker said what it collected: still exit 5
    assert nothing.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED
