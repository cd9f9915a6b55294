use super::*;

const GIB: u64 = 1 << 30;
const MS: u64 = 1_000_000;

fn h(pid: i32, driver: u64, charged: Option<u64>) -> Held {
    Held {
        pid,
        driver,
        charged,
    }
}

#[test]
fn within_the_cap_nobody_is_killed() {
    assert!(victims(GIB, &[h(1, GIB / 2, None), h(2, GIB / 2, Some(GIB / 2))]).is_empty());
    assert!(victims(GIB, &[]).is_empty());
}

#[test]
fn the_process_the_ledger_does_not_know_goes_first() {
    // A well-behaved 700 MiB process and a 600 MiB bypass under a 1 GiB cap: the bypass,
    // though smaller, is the one the ledger does not account for.
    let held = [h(1, 700 * MIB, Some(700 * MIB)), h(2, 600 * MIB, None)];
    assert_eq!(victims(GIB, &held), vec![2]);
    // A process whose charge was written down to 0 counts as unaccounted too.
    let held = [h(1, 700 * MIB, Some(700 * MIB)), h(2, 600 * MIB, Some(0))];
    assert_eq!(victims(GIB, &held), vec![2]);
}

#[test]
fn then_the_largest_until_under_the_cap() {
    let held = [
        h(1, 300 * MIB, Some(300 * MIB)),
        h(2, 900 * MIB, Some(900 * MIB)),
        h(3, 500 * MIB, Some(500 * MIB)),
    ];
    // 1700 MiB under 1 GiB: killing 2 leaves 800 MiB.
    assert_eq!(victims(GIB, &held), vec![2]);
    // Under 512 MiB: 2, then 3 (leaving 300 MiB).
    assert_eq!(victims(512 * MIB, &held), vec![2, 3]);
    // Under 0 (nothing fits): everyone holding memory.
    let mut v = victims(0, &held);
    v.sort();
    assert_eq!(v, vec![1, 2, 3]);
}

#[test]
fn ledger_mismatch_needs_more_than_the_slack() {
    assert!(!ledger_short(900 * MIB, 900 * MIB));
    assert!(!ledger_short(900 * MIB, 950 * MIB));
    assert!(ledger_short(0, 900 * MIB));
    assert!(ledger_short(300 * MIB, 1200 * MIB));
    // The ledger saying more than the driver (charges of a process the driver has already
    // released) is not a finding.
    assert!(!ledger_short(GIB, 0));
    // Large slices get a proportional slack.
    assert!(!ledger_short(60 * GIB, 63 * GIB));
    assert!(ledger_short(60 * GIB, 70 * GIB));
    // A look again: against the larger of the ledger's two reads around the driver's.
    assert!(!short_at_a_look(300 * MIB, 900 * MIB, 900 * MIB));
    assert!(!short_at_a_look(900 * MIB, 900 * MIB, 300 * MIB));
    assert!(short_at_a_look(300 * MIB, 900 * MIB, 300 * MIB));
    assert!(short_at_a_look(0, 900 * MIB, 0));
}

fn cfg(text: &str) -> Config {
    Config::from_hook_file(text, std::iter::empty::<(&str, &str)>()).unwrap()
}

#[test]
fn one_limit_for_every_device() {
    let c = cfg("CUSLICE_MEMORY_LIMIT=1GiB\nCUSLICE_CORE_LIMIT=30\n");
    let uuids = vec!["GPU-a".to_string(), "GPU-b".to_string()];
    for u in &uuids {
        let l = limits_for(&c, u, &uuids, None, Some("1"));
        assert_eq!((l.memory, l.core_limit), (Some(GIB), Some(30)));
    }
}

#[test]
fn per_device_limits_follow_the_visible_devices() {
    let c = cfg("CUSLICE_MEMORY_LIMIT_0=1GiB\nCUSLICE_MEMORY_LIMIT_1=2GiB\n");
    let uuids: Vec<String> = ["GPU-a0", "GPU-b1", "GPU-c2"].map(String::from).to_vec();
    let mem =
        |u: &str, nv: Option<&str>, cv: Option<&str>| limits_for(&c, u, &uuids, nv, cv).memory;
    assert_eq!(mem("GPU-a0", None, None), Some(GIB));
    assert_eq!(mem("GPU-b1", None, None), Some(2 * GIB));
    assert_eq!(mem("GPU-c2", None, None), None);
    // CUDA_VISIBLE_DEVICES=2,0: ordinal 0 is GPU-c2, 1 is GPU-a0.
    assert_eq!(mem("GPU-c2", None, Some("2,0")), Some(GIB));
    assert_eq!(mem("GPU-a0", None, Some("2,0")), Some(2 * GIB));
    // By UUID prefix, over what the container sees (NVIDIA_VISIBLE_DEVICES=1,2).
    assert_eq!(mem("GPU-c2", Some("1,2"), None), Some(2 * GIB));
    assert_eq!(mem("GPU-b1", Some("GPU-b"), Some("0")), Some(GIB));
    // A device the process should not see: the strictest cap.
    assert_eq!(mem("GPU-b1", None, Some("0")), Some(GIB));
    assert_eq!(mem("GPU-c2", Some("none"), None), Some(GIB));
    // An invalid entry cuts the list, as CUDA does.
    assert_eq!(mem("GPU-b1", None, Some("0,x,1")), Some(GIB));
}

#[test]
fn samples_become_device_time() {
    let mut c = SampleClock::new(0);
    // The first sample of a process, before any period is known, stands for up to 1 s.
    assert_eq!(c.take(7, 1_000_000, 100), S);
    // 100 ms later: the period is 100 ms; 50% is 50.5% of it.
    assert_eq!(c.take(7, 1_100_000, 50), 100 * MS * 101 / 200);
    // A repeated stamp counts nothing.
    assert_eq!(c.take(7, 1_100_000, 50), 0);
    // After a gap of 1 s (the process was idle), a sample stands for one period only.
    assert_eq!(c.take(7, 2_100_000, 100), 100 * MS);
    // Another process's first sample, once the period is known, stands for one period.
    assert_eq!(c.take(8, 2_100_000, 100), 100 * MS);
    assert_eq!(c.seen_us, 2_100_000);
    c.forget_before(5_000_000, 1_000_000);
    assert_eq!(c.take(8, 5_000_000, 0), 100 * MS / 200);
}

#[test]
fn the_model_is_told_from_the_stamps() {
    assert_eq!(sample_model(None, 50_000_000), SampleModel::OnePerPeriod);
    assert_eq!(
        sample_model(Some(45_000_000), 50_000_000),
        SampleModel::PerProcess
    );
    assert_eq!(
        sample_model(Some(39_000_000), 50_000_000),
        SampleModel::OnePerPeriod
    );
}

#[test]
fn one_sample_a_period_gives_the_devices_busy_time() {
    let mut c = SampleClock::new(0);
    // The first stamp stands for up to 1 s before a period is known; then one period.
    assert_eq!(c.take_stamp(1_000_000, 100), (S, S));
    assert_eq!(
        c.take_stamp(1_200_000, 50),
        (200 * MS, 200 * MS * 101 / 200)
    );
    assert_eq!(c.take_stamp(1_200_000, 50), (0, 0));
    // A gap (nothing ran): one period only.
    assert_eq!(c.take_stamp(3_000_000, 100), (200 * MS, 200 * MS));
    assert_eq!(c.seen_us, 3_000_000);
}

fn party(limit: Option<f64>, known: bool) -> Party {
    Party {
        cap: limit.filter(|_| known).map(|l| (l + OVER_PCT) / 100.0),
        limited: limit.is_some(),
    }
}

#[test]
fn a_bound_only_where_the_driver_establishes_it() {
    let dt = S as i64;
    let busy = S; // the device busy throughout a 1 s step
    let b = |parties: &[Party]| bounds(busy, S, parties);
    // Alone: the device's busy time is the slice's.
    assert_eq!(b(&[party(Some(30.0), true)]), vec![Bound::Established(dt)]);
    // Two honest slices at 70 and 30 flat out: neither is blamed for the other; what the
    // device did beyond their limits (+ 5 each) is someone's: none here.
    assert_eq!(
        b(&[party(Some(70.0), true), party(Some(30.0), true)]),
        vec![Bound::Shared(-dt / 10), Bound::Shared(-dt / 10)]
    );
    // Two slices at 20 and 30, the device busy throughout: 40 points beyond their limits
    // (+ 5 each), someone's, not attributable.
    assert_eq!(
        b(&[party(Some(20.0), true), party(Some(30.0), true)]),
        vec![Bound::Shared(dt * 40 / 100), Bound::Shared(dt * 40 / 100)]
    );
    // A slice at 20 whose process is unknown to its ledger (it went around the library)
    // beside an honest one at 30: at least 100 - 35 = 65% is its own; the honest one
    // cannot be bounded (the other may have used anything).
    assert_eq!(
        b(&[party(Some(20.0), false), party(Some(30.0), true)]),
        vec![Bound::Established(dt * 65 / 100), Bound::Unbounded]
    );
    // Beside a slice with no limit, or a process in no slice: nothing established.
    assert_eq!(
        b(&[party(Some(70.0), true), party(None, true)]),
        vec![Bound::Unbounded, Bound::Established(dt * 25 / 100)]
    );
    // Two that went around the library: neither bounded.
    assert_eq!(
        b(&[party(Some(20.0), false), party(Some(30.0), false)]),
        vec![Bound::Unbounded, Bound::Unbounded]
    );
    // An idle device: the bound is negative (nothing established beyond zero).
    assert_eq!(
        bounds(0, S, &[party(Some(20.0), false), party(Some(30.0), true)])[0],
        Bound::Established(-dt * 35 / 100)
    );
}

#[test]
fn a_negative_bound_is_credit_up_to_the_bank() {
    let rate = enforced_rate(20.0);
    let mut b = Bucket {
        tokens: -(100 * MS as i64),
    };
    b.step_signed(rate, 0, -(50 * MS as i64));
    assert_eq!(b.tokens, -(50 * MS as i64));
    b.step_signed(rate, 0, -(S as i64));
    assert_eq!(b.tokens, BANK_NS);
    b.step_signed(rate, 0, 300 * MS as i64);
    assert_eq!(b.tokens, BANK_NS - 300 * MS as i64);
    // The window's sum never goes below 0.
    let mut w = Window::default();
    w.add_signed(0, 0, 0);
    w.add_signed(S, -(S as i64) / 2, 0);
    w.add_signed(2 * S, (S as i64) / 4, 0);
    assert_eq!(w.usage().unwrap().share, 0.0);
    w.add_signed(3 * S, S as i64, 0);
    assert!((w.usage().unwrap().share - 0.25).abs() < 1e-9);
}

#[test]
fn memory_no_entry_shows_beyond_the_caps() {
    // The H200's figures: 3072 MiB of managed memory raised the device's used memory, the
    // process's entry showed its context's 518 MiB; the driver's own 600 MiB.
    let used = 600 * MIB + 518 * MIB + 3072 * MIB;
    // A slice capped at 1 GiB (506 MiB of headroom under its entry): 2566 MiB unattributed.
    assert_eq!(
        unattributed(used, 518 * MIB, 600 * MIB, Some(506 * MIB)),
        Some(2566 * MIB)
    );
    // Capped at 4 GiB: what it may hold as managed memory covers it.
    assert_eq!(
        unattributed(used, 518 * MIB, 600 * MIB, Some(3578 * MIB)),
        None
    );
    // A party with no cap beside it: nothing can be said.
    assert_eq!(unattributed(used, 518 * MIB, 600 * MIB, None), None);
    // Within the slack (allocations between the two readings).
    assert_eq!(
        unattributed(600 * MIB + 50 * MIB, 0, 600 * MIB, Some(0)),
        None
    );
}

#[test]
fn window_share_and_demand() {
    let mut w = Window::default();
    assert_eq!(w.usage(), None);
    w.add(0, 0, 0);
    // 10 steps of 100 ms: busy half of each, frozen the other half.
    for i in 1..=10 {
        w.add(i * 100 * MS, 50 * MS, 50 * MS);
    }
    let u = w.usage().unwrap();
    assert_eq!(u.span_ns, S);
    assert!((u.share - 0.5).abs() < 1e-9);
    assert!((u.demand - 1.0).abs() < 1e-9);
    // Old steps leave the window.
    for i in 11..=200 {
        w.add(i * 100 * MS, 30 * MS, 0);
    }
    let u = w.usage().unwrap();
    assert_eq!(u.span_ns, WINDOW_NS);
    assert!((u.share - 0.3).abs() < 1e-9, "{u:?}");
}

#[test]
fn over_the_limit_with_a_margin_and_no_flapping() {
    let u = |span_s: u64, demand: f64| {
        Some(Usage {
            span_ns: span_s * S,
            share: demand,
            demand,
            frozen: 0.0,
        })
    };
    assert!(!compute_over(None, 30.0, false));
    // Too little history: no new finding, an old one stays.
    assert!(!compute_over(u(2, 1.0), 30.0, false));
    assert!(compute_over(u(2, 0.0), 30.0, true));
    assert!(!compute_over(u(10, 0.34), 30.0, false));
    assert!(compute_over(u(10, 0.36), 30.0, false));
    // Once over, it ends only back within 3 points.
    assert!(compute_over(u(10, 0.34), 30.0, true));
    assert!(!compute_over(u(10, 0.32), 30.0, true));
}

#[test]
fn the_bucket_freezes_for_the_debt() {
    let rate = enforced_rate(30.0);
    assert!((rate - 0.32).abs() < 1e-9);
    let mut b = Bucket::default();
    // Within its rate the slice keeps its bank (less what the last step used).
    for _ in 0..100 {
        b.step(rate, 50 * MS, 15 * MS);
    }
    assert_eq!(b.tokens, BANK_NS - 15 * MS as i64);
    assert_eq!(b.freeze_for(rate), None);
    // Using the whole device for 300 ms: the bank refilled to full and 50 ms used, then 16
    // ms earned and 50 ms used in each 50 ms.
    for _ in 0..6 {
        b.step(rate, 50 * MS, 50 * MS);
    }
    assert_eq!(b.tokens, BANK_NS - 50 * MS as i64 - 5 * 34 * MS as i64);
    // 20 ms owed is 62.5 ms at 32%.
    assert_eq!(b.freeze_for(rate), Some(62_500_000));
    // A large debt is paid in slices of at most MAX_FREEZE_NS.
    b.step(rate, 0, S);
    assert_eq!(b.freeze_for(rate), Some(MAX_FREEZE_NS));
    // Frozen (nothing used), the debt is earned back.
    for _ in 0..100 {
        b.step(rate, 50 * MS, 0);
    }
    assert_eq!(b.freeze_for(rate), None);
}

#[test]
fn a_frozen_duty_cycle_holds_the_rate() {
    // A slice that uses the whole device whenever it is not frozen, stepped every 50 ms
    // with its samples arriving 100 ms late, held by freezing: its long-run share is the
    // enforced rate.
    let rate = enforced_rate(30.0);
    let mut b = Bucket::default();
    let mut frozen_until = 0u64;
    let mut pending: VecDeque<u64> = VecDeque::new();
    let (mut used, step) = (0u64, 10 * MS);
    let total = 600 * S / 10;
    let mut t = 0;
    while t < total {
        let running = t >= frozen_until;
        pending.push_back(if running { step } else { 0 });
        let seen = if pending.len() > 10 {
            pending.pop_front().unwrap()
        } else {
            0
        };
        used += if running { step } else { 0 };
        b.step(rate, step, seen);
        if running && let Some(f) = b.freeze_for(rate) {
            frozen_until = t + f;
        }
        t += step;
    }
    let share = used as f64 / total as f64;
    assert!((share - rate).abs() < 0.01, "{share}");
}

#[test]
fn stop_holds_by_the_debt_and_kills_past_what_freezing_holds() {
    let rate = enforced_rate(30.0);
    let b = |tokens: i64| Bucket { tokens };
    let ms = |n: u64| n * MS;
    // (tokens, frozen, just thawed) -> what to do
    let cases: &[(i64, bool, bool, Hold)] = &[
        (BANK_NS, false, false, Hold::Nothing),
        (0, false, false, Hold::Nothing),
        (0, true, false, Hold::Nothing),
        // Owes 1 ms: too little for a new freeze, but a freeze in progress lasts until
        // it is paid (3.1 ms at 32%).
        (-(MS as i64), false, false, Hold::Nothing),
        (-(MS as i64), true, false, Hold::Extend(3_125_000)),
        // Owes 16 ms: 50 ms to earn back at 32%.
        (-16 * (MS as i64), false, false, Hold::Freeze(ms(50))),
        (-16 * (MS as i64), false, true, Hold::Nothing),
        (-16 * (MS as i64), true, false, Hold::Extend(ms(50))),
        // A large debt: frozen no more than MAX_FREEZE_NS past this step, then decided again.
        (-(S as i64), false, false, Hold::Freeze(MAX_FREEZE_NS)),
        (-(S as i64), true, false, Hold::Extend(MAX_FREEZE_NS)),
        (-KILL_DEBT_NS, true, false, Hold::Extend(MAX_FREEZE_NS)),
        // More than freezing holds: kill, frozen or not, just thawed or not.
        (-KILL_DEBT_NS - 1, true, false, Hold::Kill),
        (-KILL_DEBT_NS - 1, false, true, Hold::Kill),
    ];
    for &(tokens, frozen, thawed, want) in cases {
        assert_eq!(
            b(tokens).hold(rate, frozen, thawed),
            want,
            "{tokens} owed, frozen {frozen}, just thawed {thawed}"
        );
    }
    // After the kill the debt stands, and only new use beyond it kills again.
    let mut k = b(-3 * (S as i64));
    k.killed();
    assert_eq!(k.debt_ns(), KILL_DEBT_NS as u64);
    assert_eq!(k.hold(rate, true, false), Hold::Extend(MAX_FREEZE_NS));
    k.step(rate, 50 * MS, 50 * MS);
    assert_eq!(k.hold(rate, true, false), Hold::Kill);
    assert_eq!(b(5).debt_ns(), 0);
}

#[test]
fn a_queue_that_runs_while_frozen_is_held_by_the_debt() {
    // A slice that keeps four 100 ms kernels queued whenever it runs: frozen, the device
    // still runs what it queued (up to 400 ms). The samples arrive 100 ms late. Frozen for
    // the debt the driver shows, its long-run share is the enforced rate, and it never
    // owes enough to be killed.
    let rate = enforced_rate(30.0);
    let mut b = Bucket::default();
    let step = 10 * MS;
    let (mut frozen, mut until, mut thawed_at) = (false, 0u64, None::<u64>);
    let mut queued = 0u64; // device time queued, ns
    let mut pending: VecDeque<u64> = VecDeque::new();
    let (mut used, mut worst) = (0u64, 0u64);
    let total = 600 * S / 10;
    let mut t = 0;
    while t < total {
        if !frozen {
            queued = 400 * MS; // refilled as kernels complete
        }
        let ran = queued.min(step);
        queued -= ran;
        used += ran;
        pending.push_back(ran);
        let seen = if pending.len() > 10 {
            pending.pop_front().unwrap()
        } else {
            0
        };
        b.step(rate, step, seen);
        worst = worst.max(b.debt_ns());
        if frozen && t >= until {
            frozen = false;
            thawed_at = Some(t);
        }
        // The meter decides every 50 ms.
        if t % (50 * MS) == 0 {
            let just = thawed_at.is_some_and(|x| t - x < 50 * MS);
            match b.hold(rate, frozen, just) {
                Hold::Freeze(ns) => (frozen, until) = (true, t + ns),
                Hold::Extend(ns) => until = until.max(t + ns),
                Hold::Kill => panic!("killed at {t}"),
                Hold::Nothing => {}
            }
        }
        t += step;
    }
    let share = used as f64 / total as f64;
    assert!((share - rate).abs() < 0.01, "{share}");
    assert!(worst < (KILL_DEBT_NS / 2) as u64, "{worst}");
}

#[test]
fn time_over_the_cap_adds_up_within_the_window() {
    assert_eq!(over_window_s(2.0, 1.0), 20.0);
    assert_eq!(over_window_s(0.0, 1.0), 10.0);
    assert_eq!(over_window_s(0.5, 0.1), 5.0);
    let w = over_window_s(2.0, 1.0);
    // Checks 1 s apart: (time, over) ... -> the total at the last check.
    let f = false;
    let t = true;
    type Case<'a> = (&'a str, &'a [(f64, bool)], f64);
    let cases: &[Case] = &[
        ("never over", &[(0.0, f), (1.0, f), (2.0, f)], 0.0),
        ("over throughout", &[(0.0, t), (1.0, t), (2.0, t)], 2.0),
        (
            "went over between two checks",
            &[(0.0, f), (1.0, t), (2.0, t)],
            1.5,
        ),
        (
            "came back between two checks",
            &[(0.0, t), (1.0, f), (2.0, f)],
            0.5,
        ),
        ("seen over once", &[(0.0, f), (1.0, t), (2.0, f)], 1.0),
        // Over from 0.3 to 2.1 s of every 3 s (a loop holding for 1.8 s, resting for 1.2):
        // never over for 2 s at once, over for 2 s in total by the check at 3 s.
        ("in pieces", &[(0.0, f), (1.0, t), (2.0, t), (3.0, f)], 2.0),
        (
            "in pieces, on",
            &[(0.0, f), (1.0, t), (2.0, t), (3.0, f), (4.0, t)],
            2.5,
        ),
        // What is older than the window is forgotten.
        (
            "out of the window",
            &[(0.0, t), (1.0, t), (2.0, f), (25.0, f)],
            0.0,
        ),
    ];
    for (what, checks, want) in cases {
        let mut o = OverTime::default();
        let mut got = 0.0;
        for &(now, over) in *checks {
            got = o.check(now, over, w);
        }
        assert_eq!(got, *want, "{what}");
        assert_eq!(o.total(), *want, "{what}");
    }
    // Over at 0 and 1 s, back by 2 s, over again at 21 s: at 21 s the window (1 s to 21 s)
    // holds the half second before 2 s and the half before 21 s.
    let mut o = OverTime::default();
    for i in 0..=21 {
        o.check(f64::from(i), i < 2 || i == 21, w);
    }
    assert_eq!(o.total(), 1.0);
    // A kill is remembered for the window.
    let mut o = OverTime::default();
    o.check(0.0, true, w);
    o.kill = Some((0.0, vec![7]));
    o.check(19.0, false, w);
    assert!(o.kill.is_some() && !o.idle());
    o.check(20.0, false, w);
    assert!(o.kill.is_none());
    o.check(41.0, false, w);
    assert!(o.idle());
}

#[test]
fn memory_action_by_time_over_and_kills() {
    let cap = GIB;
    let bypass = [h(1, 300 * MIB, Some(300 * MIB)), h(2, 1800 * MIB, None)];
    let killed = (0.0, vec![2]);
    // (what, held, time over, last kill, action)
    type Case<'a> = (
        &'a str,
        &'a [Held],
        f64,
        Option<&'a (f64, Vec<i32>)>,
        MemoryAction,
    );
    let cases: &[Case] = &[
        (
            "within its cap",
            &[h(1, GIB, None)],
            10.0,
            None,
            MemoryAction::Nothing,
        ),
        (
            "over, for less than the grace",
            &bypass,
            1.5,
            None,
            MemoryAction::Nothing,
        ),
        (
            "over, for the grace",
            &bypass,
            2.0,
            None,
            MemoryAction::Kill(vec![2]),
        ),
        (
            "over, for more",
            &bypass,
            9.0,
            None,
            MemoryAction::Kill(vec![2]),
        ),
        // The killed process is still counted until the driver releases it.
        (
            "after a kill, not released yet",
            &bypass,
            3.0,
            Some(&killed),
            MemoryAction::Nothing,
        ),
        (
            "after a kill, under the cap",
            &[h(1, 300 * MIB, Some(300 * MIB))],
            3.0,
            Some(&killed),
            MemoryAction::Nothing,
        ),
        // The bypass started again: the whole container.
        (
            "after a kill, over again",
            &[h(1, 300 * MIB, Some(300 * MIB)), h(3, 1800 * MIB, None)],
            3.0,
            Some(&killed),
            MemoryAction::KillAll,
        ),
        (
            "after a kill, over again at once",
            &[h(1, 300 * MIB, Some(300 * MIB)), h(3, 1800 * MIB, None)],
            0.0,
            Some(&killed),
            MemoryAction::KillAll,
        ),
    ];
    for (what, held, over, kill, want) in cases {
        assert_eq!(memory_action(cap, held, *over, 2.0, *kill), *want, "{what}");
    }
}

#[test]
fn a_limit_changed_while_running_is_told_apart_from_a_first_one() {
    let cases = [
        (false, None, Some(30.0), false),
        (false, Some(30.0), Some(40.0), false),
        (true, Some(30.0), Some(30.0), false),
        (true, None, None, false),
        (true, Some(30.0), Some(40.0), true),
        (true, Some(40.0), Some(5.0), true),
        (true, None, Some(30.0), true),
        (true, Some(30.0), None, true),
    ];
    for (seen, was, now, want) in cases {
        assert_eq!(
            limit_changed(seen, was, now),
            want,
            "{seen} {was:?} {now:?}"
        );
    }
}

#[test]
fn findings_start_and_end_once() {
    let mut t: Tracker<&str> = Tracker::default();
    let (s, e) = t.update(1.0, &["a", "b"]);
    assert_eq!((s, e), (vec!["a", "b"], vec![]));
    let (s, e) = t.update(2.0, &["a", "b"]);
    assert!(s.is_empty() && e.is_empty());
    let (s, e) = t.update(3.0, &["b", "c"]);
    assert_eq!((s, e), (vec!["c"], vec![("a", 1.0)]));
    assert_eq!(t.since(&"b"), Some(1.0));
    assert!(t.active(&"c") && !t.active(&"a"));
}

#[test]
fn a_lowered_cap_allows_what_was_held_then_shrinking_as_it_is_freed() {
    const G: u64 = 1 << 30;
    // Lowered from 2 GiB to 512 MiB while holding 1.5 GiB: 1.5 GiB allowed.
    let a = lowered_allowance(Some(2 * G), Some(G / 2), 3 * G / 2, None);
    assert_eq!(a, Some(3 * G / 2));
    // Freed down to 1 GiB: allowed 1 GiB; growing again is not allowed past that.
    let a = lowered_allowance(Some(G / 2), Some(G / 2), G, a);
    assert_eq!(a, Some(G));
    assert_eq!(
        lowered_allowance(Some(G / 2), Some(G / 2), 2 * G, a),
        Some(G)
    );
    // Under the cap: gone for good.
    assert_eq!(lowered_allowance(Some(G / 2), Some(G / 2), G / 4, a), None);
    // Over a cap that was never lowered (a bypass, a ledger written over): nothing allowed.
    assert_eq!(lowered_allowance(Some(G), Some(G), 2 * G, None), None);
    assert_eq!(lowered_allowance(None, Some(G), 2 * G, None), None);
    // Lowered over more than the old cap allowed (already over it): the old cap at most.
    assert_eq!(
        lowered_allowance(Some(G), Some(G / 2), 2 * G, None),
        Some(G)
    );
}

/// Steps of 0.2 s, one stamp each, naming the slice with probability `p` (a fixed
/// pseudo-random sequence), the device busy throughout; whether `named_over` said over at each
/// step.
fn named_run(p: f64, limit: f64, steps: u64, seed: u64) -> Vec<bool> {
    let (mut named, mut x) = (Named::default(), seed);
    let step = 200 * MS;
    (1..=steps)
        .map(|i| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let hit = ((x >> 33) as f64 / (1u64 << 31) as f64) < p;
            named.add(i * step, if hit { step } else { 0 }, step, 1);
            named_over(named.share(), limit)
        })
        .collect()
}

#[test]
fn the_stamps_that_name_a_slice_judge_it_only_far_over_its_limit() {
    // Too few stamps: nothing judged, whatever they name.
    let mut named = Named::default();
    for i in 1..NAMED_MIN_STAMPS {
        named.add(i * 200 * MS, 200 * MS, 200 * MS, 1);
    }
    assert_eq!(named.share(), None);
    assert!(!named_over(named.share(), 30.0));
    // An honest slice at its limit of 30 (named in 30% of the stamps, and in 35%: its limit plus
    // the 5 points a slice may be over) is never found over, over an hour of stamps.
    for (p, seed) in [(0.30, 1), (0.35, 2), (0.35, 3)] {
        assert!(
            !named_run(p, 30.0, 18_000, seed).into_iter().any(|o| o),
            "named {p}"
        );
    }
    // A slice named in 75% of them (a bypass beside honest neighbours) is found over once the
    // window holds enough stamps.
    let run = named_run(0.75, 30.0, 600, 4);
    let first = run.iter().position(|&o| o).expect("found over");
    assert_eq!(first as u64 + 1, NAMED_MIN_STAMPS);
    // The window forgets the stamps older than NAMED_WINDOW_NS: named in 75% of them for a
    // while, then 25%, the share is the latter's.
    let mut named = Named::default();
    let step = 200 * MS;
    for i in 1..=300 {
        named.add(i * step, if i % 4 != 0 { step } else { 0 }, step, 1);
    }
    assert!(named_over(named.share(), 30.0));
    for i in 301..=600 {
        named.add(i * step, if i % 4 == 0 { step } else { 0 }, step, 1);
    }
    let share = named.share().expect("enough stamps");
    assert!((share.share - 0.25).abs() < 0.01, "{share:?}");
    assert!(!named_over(Some(share), 30.0));
}
