"""Unit tests of the real-GPU tier's own arithmetic and report (no GPU, no simulator):
    python3 -m unittest discover -s tests/gpu -p 'test_*.py'
tests/run runs these, then the tier itself on the simulated GPU."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
RELEASE = os.path.join(HERE, "..", "..", "target", "release")
sys.path.insert(0, HERE)

from gpu_tier import common, compute, memory, nvml, overhead, report  # noqa: E402
from gpu_tier.common import FAIL, GIB, INFO, MIB, NOT_RUN, PASS, Check, Proc, Spec  # noqa: E402


def proc(*events, rc=0, stderr=""):
    return Proc(spec=Spec(["x"]), pid=42, rc=rc, stderr=stderr,
                stdout="\n".join(json.dumps(e) for e in events) + "\nnot json\n")


class PeakHeld(unittest.TestCase):
    def test_per_process_counts_win_and_sum_at_one_sample(self):
        samples = [(0.0, 100, {1: 10, 2: 5, 9: 99}), (0.1, 100, {1: 20}), (0.2, 100, {1: 12, 2: 12})]
        self.assertEqual(nvml.peak_held(samples, [1, 2]), (24, "process"))
        self.assertEqual(nvml.peak_held(samples, [1]), (20, "process"))

    def test_device_used_above_the_baseline_when_nvml_lists_no_process(self):
        samples = [(0.0, 1000, {}), (0.1, 5000, {}), (0.2, None, {})]
        self.assertEqual(nvml.peak_held(samples, [1], baseline_used=800), (4200, "device"))
        self.assertEqual(nvml.peak_held(samples, [1]), (None, None))
        self.assertEqual(nvml.peak_held([], [1], 0), (None, None))


    def test_the_device_above_its_baseline(self):
        # A managed fill on an H200: NVML's entry for the process stays at its context while the
        # device's used memory rises by what the process touched.
        samples = [(0.0, 1141 * MIB, {1: 518 * MIB}), (0.1, 4661 * MIB, {1: 518 * MIB}), (0.2, None, {})]
        self.assertEqual(nvml.peak_device(samples, 615 * MIB), 4046 * MIB)
        self.assertIsNone(nvml.peak_device(samples, None))
        self.assertIsNone(nvml.peak_device([(0.0, None, {})], 0))


class Share(unittest.TestCase):
    # Two processes sampled every 100 ms (timestamps in us) for 2 s: 30% and 70% of each period,
    # which NVML reports rounded down.
    UTIL = [(pid, int(t * 1e5), sm) for t in range(1, 21) for pid, sm in ((1, 29), (2, 69))]

    def test_period_and_share(self):
        self.assertEqual(nvml.sample_period_us(self.UTIL), 100_000)
        self.assertAlmostEqual(nvml.share(self.UTIL, 1, 0.0, 2.0), 29.5)
        self.assertAlmostEqual(nvml.share(self.UTIL, 2, 0.0, 2.0), 69.5)
        self.assertAlmostEqual(nvml.share(self.UTIL, 2, 1.0, 2.0), 69.5)
        self.assertEqual(nvml.share(self.UTIL, 3, 0.0, 2.0), 0.0, "no samples: it did not run")

    def test_full_and_empty_samples_are_exact(self):
        util = [(1, t * 100_000, 100) for t in range(1, 11)] + [(2, t * 100_000, 0) for t in range(1, 11)]
        self.assertAlmostEqual(nvml.share(util, 1, 0.0, 1.0), 100.0)
        self.assertAlmostEqual(nvml.share(util, 2, 0.0, 1.0), 0.0)

    def test_no_period_or_window_gives_none(self):
        self.assertIsNone(nvml.share([(1, 5, 50)], 1, 0.0, 1.0))
        self.assertIsNone(nvml.share(self.UTIL, 1, 1.0, 1.0))

    def test_the_period_comes_from_every_stamp(self):
        # As the real driver reported two time-sliced processes: one pid per 200 ms stamp.
        util = [(1 if t % 5 else 2, t * 200_000, 99) for t in range(1, 31)]
        self.assertEqual(nvml.sample_period_us(util), 200_000)
        self.assertTrue(compute.one_per_period(util))
        self.assertFalse(compute.one_per_period(self.UTIL), "both at each stamp")

    def test_slices_at_once_are_judged_by_throughput_and_a_slice_alone_by_nvml(self):
        util = [(1 if t % 5 else 2, t * 200_000, 99) for t in range(1, 31)]
        checks = compute.judge_shares("x", ["a", "b"], [1, 2], [70, 30], util, 0.0, 6.0, [69.0, 26.0],
                                      together=True, worst=[68.0, 25.0])
        self.assertEqual([c.data["by"] for c in checks], ["throughput", "throughput"])
        self.assertEqual([c.status for c in checks], [PASS, FAIL])
        self.assertIn("26.0% by throughput over 6.0 s", checks[1].figure)
        self.assertIn("worst 1 s window 25.0%", checks[1].figure)
        # Per-process samples of both at every stamp: still throughput, for slices at once.
        checks = compute.judge_shares("x", ["a", "b"], [1, 2], [30, 70], self.UTIL, 0.0, 2.0, [10.0, 10.0],
                                      together=True)
        self.assertEqual([c.status for c in checks], [FAIL, FAIL])
        # No throughput figure (spin kernels): slices at once are not judged by anything else.
        checks = compute.judge_shares("x", ["a", "b"], [1, 2], [30, 70], self.UTIL, 0.0, 2.0, None, together=True)
        self.assertEqual([c.status for c in checks], [FAIL, FAIL])
        self.assertIn("no throughput figure", checks[0].figure)
        # Alone: NVML judges, the throughput beside.
        (check,) = compute.judge_shares("x", ["a"], [[1]], [30], self.UTIL, 0.0, 2.0, [12.0])
        self.assertEqual((check.status, check.data["by"]), (PASS, "nvml"))
        self.assertIn("29.5% by NVML", check.figure)
        self.assertIn("by throughput 12.0%", check.figure)

    def test_a_loop_bound_by_the_hosts_launches_is_judged_as_share_py_judges_it(self):
        util = [(1 if t % 5 else 2, t * 200_000, 99) for t in range(1, 31)]
        checks = compute.judge_shares("x", ["a", "b"], [1, 2], [30, 70], util, 0.0, 6.0, [27.5, 67.5],
                                      together=True, tolerance=3.0)
        self.assertEqual([c.status for c in checks], [PASS, PASS])
        self.assertIn("70% +- 3 points", checks[1].expected)
        self.assertEqual(compute._share_py().LAUNCH_BOUND_CHECK["50us 30/70"][0], 3.0)
        checks = compute.judge_shares("x", ["a", "b"], [1, 2], [30, 70], util, 0.0, 6.0, [27.5, 67.5],
                                      together=True)
        self.assertEqual([c.status for c in checks], [FAIL, FAIL])

    def test_a_run_on_the_simulator_may_hold_in_proportion(self):
        util = [(1 if t % 5 else 2, t * 200_000, 99) for t in range(1, 31)]
        # The host left the device idle: 28.5 + 65.5 of the rate alone, split 30.3 / 69.7.
        checks = compute.judge_shares("x", ["a", "b"], [1, 2], [30, 70], util, 0.0, 6.0, [28.5, 65.5],
                                      together=True)
        self.assertEqual([c.status for c in checks], [PASS, FAIL])
        rate = compute.Check(compute.GROUP, "x: rate alone", "95.5%", "reference", INFO)
        held = compute.in_proportion([rate] + checks, compute._share_py().TOGETHER)
        self.assertEqual([c.status for c in held], [INFO, PASS, PASS])
        held = held[1:]
        self.assertIn("held in proportion", held[1].figure)
        self.assertAlmostEqual(held[1].data["in_proportion"], 100 * 65.5 / 94.0)
        # Split wrong: 35.0 / 57.0 is 38.0 / 62.0 of what they got.
        wrong = compute.judge_shares("x", ["a", "b"], [1, 2], [30, 70], util, 0.0, 6.0, [35.0, 57.0],
                                     together=True)
        self.assertEqual([c.status for c in compute.in_proportion(wrong, compute._share_py().TOGETHER)], [FAIL, FAIL])
        # Too little of the device together: not judged in proportion.
        idle = compute.judge_shares("x", ["a", "b"], [1, 2], [30, 70], util, 0.0, 6.0, [20.0, 50.0],
                                    together=True)
        self.assertEqual([c.status for c in compute.in_proportion(idle, compute._share_py().TOGETHER)], [FAIL, FAIL])
        # Shares that are not the whole device: unchanged.
        part = compute.judge_shares("x", ["a", "b"], [1, 2], [20, 30], util, 0.0, 6.0, [18.0, 26.0],
                                    together=True)
        self.assertEqual([c.status for c in compute.in_proportion(part, compute._share_py().TOGETHER)], [PASS, FAIL])

    def test_throughput_from_progress_lines(self):
        share = compute._share_py()
        out = "\n".join(json.dumps({"event": "progress", "mono_ns": int(t * 1e9), "work_ns": int(w * 1e9)})
                        for t, w in ((10.25, 0.1), (10.5, 0.2), (11.5, 0.5), (12.0, 0.6)))
        series = share.progress(out + "\n{\"event\": \"launched\"}", 10.0)
        self.assertEqual(series[0], (0.25, 100_000_000))
        # 0.3 s of work in the second from 0.5 s: 30%; half-way between lines by interpolation.
        self.assertAlmostEqual(share.throughput([series], 0.5, 1.5), 30.0)
        self.assertAlmostEqual(share.throughput([series], 1.0, 2.0), 25.0)
        # A slice of two processes: their sum; after its last line a process did nothing more.
        self.assertAlmostEqual(share.throughput([series, series], 0.5, 1.5), 60.0)
        self.assertAlmostEqual(share.throughput([series], 2.0, 3.0), 0.0)

    def test_a_pair_the_host_left_idle_holds_in_proportion_and_a_wrong_split_does_not(self):
        share = compute._share_py()

        def row(want, got, windows):
            return dict(expected=want, judged=got, simulator=got, alone=None,
                        windows=[(3.0 + 0.25 * i, w) for i, w in enumerate(windows)])

        # A 4-stream pair on a busy host: 27.2 / 67.6% over the run, a 1 s window at 23.7%.
        idle = [row(30, 27.2, [29.0, 23.7]), row(70, 67.6, [66.0, 62.7])]
        self.assertEqual(len(share.misses("4 streams 30/70", "x", idle, 2.0, 5.0)), 4)
        held = share.split(idle)
        self.assertAlmostEqual(held[0]["judged"], 28.7, places=1)
        self.assertAlmostEqual(held[1]["windows"][1][1], 72.6, places=1)
        self.assertEqual(share.misses("4 streams 30/70", "x", held, 2.0, 5.0), [])
        # The device busy, split wrong: no proportion makes 40 / 60 into 30 / 70.
        wrong = share.split([row(30, 40.0, [40.0]), row(70, 60.0, [60.0])])
        self.assertEqual(len(share.misses("30/70", "x", wrong, 2.0, 5.0)), 4)
        # Slices that lost more than a fifth of the device together are not judged in proportion,
        # however they split the rest (16.5 / 39.5: 29.5 / 70.5 of 56%).
        self.assertIsNone(share.split([row(30, 16.5, [16.5]), row(70, 39.5, [39.5])]))
        # Shares that leave the device idle by design are judged as they are,
        self.assertIsNone(share.split([row(10, 6.7, [6.7]), row(20, 12.7, [12.7])]))
        # but for loops the host holds back (their rate alone 35%), what the host ran of them:
        # 8.2 / 16.8 is 9.8 / 20.2 of what they were configured; 12.0 / 12.0 is split wrong.
        def bound(want, got, windows):
            return dict(row(want, got, windows), alone=35.0)

        slow = share.split([bound(10, 8.2, [8.0, 8.6]), bound(20, 16.8, [13.9, 17.0])])
        self.assertAlmostEqual(slow[0]["judged"], 9.84, places=2)
        self.assertAlmostEqual(slow[1]["windows"][0][1], 30 * 13.9 / 21.9, places=2)
        self.assertEqual(share.misses("10us 10/20", "x", slow, 2.0, 5.0), [])
        self.assertEqual(len(share.misses("10us 10/20", "x", share.split(
            [bound(10, 12.0, [12.0]), bound(20, 12.0, [12.0])]), 2.0, 5.0)), 2)
        # A host that ran them at 70% of their rate alone in their turns: held in proportion.
        self.assertEqual(share.misses("10us 10/20", "x", share.split(
            [bound(10, 7.0, [7.0]), bound(20, 14.0, [14.0])]), 2.0, 5.0), [])
        # Outside 60 to 125% of what they were configured together: not the host's speed.
        self.assertIsNone(share.split([bound(10, 15.0, [15.0]), bound(20, 30.0, [30.0])]))
        self.assertIsNone(share.split([bound(10, 5.5, [5.5]), bound(20, 11.0, [11.0])]))
        # Shares that add up to the device keep every slice busy: 70% of it is a turn's loss.
        self.assertIsNone(share.split([bound(30, 21.0, [21.0]), bound(70, 49.0, [49.0])]))
        self.assertIsNone(share.split([row(20, 20.0, [20.0]), row(None, 65.0, [65.0])]))

    def test_worst_window(self):
        util = [(1, t * 100_000, 29 if t <= 10 else 49) for t in range(1, 21)]
        self.assertAlmostEqual(nvml.worst_window(util, 1, 0.0, 2.0, want=30), 49.5)


class DeviceUtilisation(unittest.TestCase):
    def test_only_the_readings_that_changed_are_logged(self):
        readings = [(0.00, 15), (0.05, 15), (0.10, 26), (0.15, 26), (0.20, 26), (0.25, 15)]
        self.assertEqual(nvml.changes(readings), [(0.00, 15), (0.10, 26), (0.25, 15)])
        self.assertEqual(nvml.changes([]), [])


class JudgeFill(unittest.TestCase):
    START = {"event": "start", "free": 3 * GIB, "reported_total": 4 * GIB}
    REFUSED = {"event": "refused", "code": 2, "call": "cuMemAlloc_v2", "count": 59, "allocated": 59 * 64 * MIB,
               "free": 20 * MIB, "total": 4 * GIB}

    def judge(self, p, peak):
        return memory.judge_fill("mem via dlsym", p, peak, "process", 4 * GIB)

    def test_refused_at_the_cap(self):
        c = self.judge(proc(self.START, self.REFUSED), 4076 * MIB)
        self.assertEqual(c.status, PASS, c.figure)
        self.assertIn("peak 4076 MiB", c.figure)

    def test_over_the_cap_early_wrong_code_or_total_fail(self):
        self.assertEqual(self.judge(proc(self.START, self.REFUSED), 4 * GIB + 1).status, FAIL)
        self.assertEqual(self.judge(proc(self.START, self.REFUSED), 3 * GIB).status, FAIL, "refused early")
        self.assertEqual(self.judge(proc(self.START, dict(self.REFUSED, code=999)), 4076 * MIB).status, FAIL)
        self.assertEqual(self.judge(proc(self.START, dict(self.REFUSED, total=80 * GIB)), 4076 * MIB).status, FAIL)
        self.assertEqual(self.judge(proc(self.START, self.REFUSED), None).status, FAIL, "NVML saw nothing")

    def test_managed_memory_is_judged_by_the_device(self):
        c = memory.judge_fill("managed via dlsym", proc(self.START, self.REFUSED), 4046 * MIB, "device",
                              4 * GIB, own=518 * MIB)
        self.assertEqual(c.status, PASS, c.figure)
        self.assertIn("peak 4046 MiB by NVML (device, its own entry 518 MiB)", c.figure)
        c = memory.judge_fill("managed via dlsym", proc(self.START, self.REFUSED), 526 * MIB, "device",
                              4 * GIB, own=518 * MIB)
        self.assertEqual(c.status, FAIL, "untouched managed memory: the device held only the context")

    def test_a_crash_fails_with_its_last_line(self):
        c = self.judge(proc(self.START, rc=-11, stderr="boom\nSegmentation fault"), 4076 * MIB)
        self.assertEqual(c.status, FAIL)
        self.assertIn("exit -11: Segmentation fault", c.figure)


class Overhead(unittest.TestCase):
    """Judging an added cost against the noise the rounds themselves show."""

    def tier(self, sim=False):
        t = common.Tier.__new__(common.Tier)
        t.sim = sim
        return t

    def test_the_order_swaps_every_other_round(self):
        self.assertEqual([overhead.order(r) for r in range(3)],
                         [("without", "with"), ("with", "without"), ("without", "with")])

    def test_added_cost_per_round(self):
        self.assertEqual(overhead.added_cost([100, 200], [110, 190]), [10, -10])
        self.assertEqual(overhead.added_cost([100, 200], [110, 190], higher_is_better=True), [-10, 10])
        self.assertEqual(overhead.added_cost([100, 200], [102, 190], relative=True), [2.0, -5.0])

    def test_judged_only_outside_the_noise(self):
        self.assertEqual(overhead.judge([10, 12, 14], 60), (PASS, 12, 2.0))
        self.assertEqual(overhead.judge([100, 110, 120], 60), (FAIL, 110, 10.0))
        # within the noise of the threshold either way: not judged
        self.assertEqual(overhead.judge([50, 60, 70], 60), (INFO, 60, 10.0))
        self.assertEqual(overhead.judge([45, 55, 65], 60)[0], INFO)
        # noise larger than the threshold: never a pass, even for an added cost below zero
        self.assertEqual(overhead.judge([-500, -100, 300], 100), (INFO, -100, 400.0))

    def test_the_h200_rounds_could_not_be_judged(self):
        # 1 MiB cuMemAlloc_v2 + cuMemFree_v2 pairs on an H200 (ns), 8 rounds: a pair takes 57-75 us
        # and moves by more than 10 us from one process to the next, against a threshold of 60 ns.
        got = {"without": [66252.3, 65577.6, 58608.8, 60541.4, 62680.8, 61611.3, 63002.5, 60306.0],
               "with": [57017.8, 58434.3, 59247.0, 66594.2, 60140.7, 74496.7, 64734.8, 63171.2]}
        c = overhead.compare(self.tier(), "alloc", got, "ns", "<= +60 ns per pair", 60)
        self.assertEqual(c.status, INFO, c.figure)
        self.assertAlmostEqual(c.data["added"], (638.2 + 1732.3) / 2, places=1)
        self.assertAlmostEqual(c.data["noise"], (12885.4 + 9234.4) / 2, places=1)
        self.assertIn("added +1185 ns +- 1.11e+04 ns", c.figure)
        self.assertTrue(c.figure.endswith("; not judged: noise 1.11e+04 ns against threshold 60 ns"), c.figure)
        # PyTorch's start-up (ms) in the first run on hardware: 4 rounds, the process times drifting
        # upwards over the run. A difference of medians said +190.8 ms and failed the 100 ms bound.
        got = {"without": [3520, 3780, 4210, 4030], "with": [3460, 3720, 4520, 4830]}
        c = overhead.compare(self.tier(), "start-up", got, "ms", "<= +100 ms", 100)
        self.assertEqual(c.status, INFO, c.figure)
        self.assertEqual(c.data["differences"], [-60, -60, 310, 800])

    def test_a_steady_figure_is_judged(self):
        got = {"without": [657.0, 656.8, 657.2], "with": [657.4, 656.9, 657.0]}
        c = overhead.compare(self.tier(), "matmul", got, "TFLOP/s", "<= 1% slower", 1.0,
                             higher_is_better=True, relative=True)
        self.assertEqual(c.status, PASS, c.figure)
        self.assertEqual(c.data["unit"], "%")
        got = {"without": [100.0, 101.0, 100.5], "with": [90.0, 91.0, 90.2]}
        c = overhead.compare(self.tier(), "matmul", got, "TFLOP/s", "<= 1% slower", 1.0,
                             higher_is_better=True, relative=True)
        self.assertEqual(c.status, FAIL, c.figure)
        got = {"without": [100.0, 100.0, 100.0], "with": [99.0, 99.5, 98.0]}
        c = overhead.compare(self.tier(), "matmul", got, "TFLOP/s", "<= 1% slower", 1.0,
                             higher_is_better=True, relative=True)
        self.assertEqual(c.status, INFO, c.figure)
        self.assertIn("not judged: within the noise of the threshold: 0.75% against threshold 1%", c.figure)

    def test_the_simulator_is_reported_not_judged(self):
        got = {"without": [100.0, 100.0, 100.0], "with": [500.0, 500.0, 500.0]}
        c = overhead.compare(self.tier(sim=True), "alloc", got, "ns", "<= +60 ns per pair", 60)
        self.assertEqual(c.status, INFO)
        self.assertIn("(not judged on the simulator)", c.expected)


class Report(unittest.TestCase):
    def result(self, part, checks):
        return {"env": {"date": "2026-11-23 12:00 UTC", "gpu": "NVIDIA H100 | 80GB", "parts": part},
                "checks": [c.to_json() for c in checks]}

    def test_markdown_has_the_environment_and_one_row_per_check(self):
        r = self.result("memory", [Check("memory", "mem via dlsym", "peak 4076 MiB", "<= 4096 MiB", PASS),
                                   Check("memory", "vmm via dlsym", "peak 5000 MiB", "<= 4096 MiB", FAIL),
                                   Check("frameworks", "JAX", "needs a real GPU", "", NOT_RUN)])
        md = report.markdown(r, ["memory.log"])
        self.assertTrue(md.startswith("# cuslice real-GPU tier: 2026-11-23\n"))
        self.assertIn("1 passed, 1 failed, 1 not run, 0 reported only (3 checks).", md)
        self.assertIn("| GPU | NVIDIA H100 \\| 80GB |", md)
        self.assertIn("| mem via dlsym | peak 4076 MiB | <= 4096 MiB | pass |", md)
        self.assertIn("| vmm via dlsym | peak 5000 MiB | <= 4096 MiB | FAIL |", md)
        self.assertIn("## Memory, frameworks", md)
        self.assertIn("- [memory.log](memory.log)", md)

    def test_merge_keeps_every_part_and_the_later_check_wins(self):
        a = self.result("memory", [Check("memory", "m", "1", "", FAIL)])
        b = self.result("compute", [Check("compute", "c", "2", "", PASS), Check("memory", "m", "3", "", PASS)])
        m = report.merge([a, b])
        self.assertEqual([(c["name"], c["figure"]) for c in m["checks"]], [("m", "3"), ("c", "2")])
        self.assertEqual(m["env"]["parts"], "memory; compute")
        self.assertEqual(report.counts(m["checks"])[PASS], 2)

    def test_runs_on_different_machines_are_not_merged(self):
        a = self.result("memory", [Check("memory", "m", "1", "", FAIL)])
        b = self.result("compute", [Check("compute", "c", "2", "", PASS)])
        b["env"]["gpu"] = "NVIDIA H200 | 141GB"
        with self.assertRaisesRegex(ValueError, "different machines .*H100.*H200"):
            report.merge([a, b])

    def test_a_foreign_file_is_refused(self):
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"checks": []}, f)
        with self.assertRaisesRegex(ValueError, "not a results.json"):
            report.load(f.name)
        os.unlink(f.name)


class Environment(unittest.TestCase):
    def test_a_callers_settings_never_leak_into_a_check(self):
        os.environ.update(CUSLICE_MEMORY_LIMIT="1GiB", LD_PRELOAD="/x.so", CUDA_DEVICE_MEMORY_LIMIT="2g")
        try:
            t = common.Tier.__new__(common.Tier)
            env = t.env({"CUSLICE_CORE_LIMIT": 30})
            self.assertNotIn("CUSLICE_MEMORY_LIMIT", env)
            self.assertNotIn("LD_PRELOAD", env)
            self.assertNotIn("CUDA_DEVICE_MEMORY_LIMIT", env)
            self.assertEqual(env["CUSLICE_CORE_LIMIT"], "30")
        finally:
            for k in ("CUSLICE_MEMORY_LIMIT", "LD_PRELOAD", "CUDA_DEVICE_MEMORY_LIMIT"):
                del os.environ[k]


class TestCommand(unittest.TestCase):
    def test_tests_run_runs_every_group_on_the_simulator_once(self):
        """tests/run runs the tier in parts (its compute alone, the rest beside the calibration):
        a group added to the tier and not to those parts would go unrun without a word."""
        import importlib.machinery
        import importlib.util
        import re
        loader = importlib.machinery.SourceFileLoader("tier_run", os.path.join(HERE, "run"))
        spec = importlib.util.spec_from_loader("tier_run", loader)
        tier_run = importlib.util.module_from_spec(spec)
        loader.exec_module(tier_run)
        with open(os.path.join(HERE, "..", "run")) as f:
            parts = re.findall(r"^\s*tests/gpu/run --sim --only (\S+)", f.read(), re.M)
        groups = [g for part in parts for g in part.split(",")]
        self.assertEqual(sorted(groups), sorted(tier_run.GROUPS), f"tests/run runs {parts}")


class TierOnTheSimulator(unittest.TestCase):
    """The tier itself can fail: a library that caps nothing fails the memory check that the real
    library passes."""

    def tier(self, lib):
        for name in ("simgpu", "cuda-workload", "cuda-workload-linked", "libcuslice.so", "libcuslice_core.so"):
            if not os.path.exists(os.path.join(RELEASE, name)):
                self.skipTest(f"target/release/{name} is not built (cargo build --release --workspace)")
        with tempfile.TemporaryDirectory() as d:
            bin_dir, out = os.path.join(d, "bin"), os.path.join(d, "out")
            os.mkdir(bin_dir)
            for name in ("simgpu", "cuda-workload", "cuda-workload-linked", "libcuslice_core.so"):
                os.symlink(os.path.realpath(os.path.join(RELEASE, name)), os.path.join(bin_dir, name))
            lib(os.path.join(bin_dir, "libcuslice.so"), d)
            run = subprocess.run([os.path.join(HERE, "run"), "--sim", "--only", "memory", "--match",
                                  "mem via dlsym", "--bin", bin_dir, "--out", out],
                                 capture_output=True, text=True, timeout=120)
            with open(os.path.join(out, "results.json")) as f:
                return run.returncode, json.load(f)["checks"]

    def test_the_library_passes(self):
        rc, checks = self.tier(lambda path, _: os.symlink(os.path.realpath(os.path.join(RELEASE, "libcuslice.so")), path))
        self.assertEqual([(c["name"], c["status"]) for c in checks], [("mem via dlsym", PASS)], checks)
        self.assertEqual(rc, 0)

    def test_a_library_that_caps_nothing_fails(self):
        def empty(path, d):
            src = os.path.join(d, "empty.c")
            with open(src, "w") as f:
                f.write("int cuslice_nothing;\n")
            subprocess.run(["cc", "-shared", "-fPIC", "-o", path, src], check=True)
        rc, checks = self.tier(empty)
        self.assertEqual([(c["name"], c["status"]) for c in checks], [("mem via dlsym", FAIL)], checks)
        self.assertIn("total 81920 MiB", checks[0]["figure"], "the whole simulated device, uncapped")
        self.assertEqual(rc, 1)


if __name__ == "__main__":
    unittest.main()
