//! Compute time-share policy: how much of a device each slice may use, and the token arithmetic
//! that holds it there. Pure functions over plain numbers; the interposer feeds them what it
//! measured and what the node's compute board says about the other slices on the device.
//!
//! Shares are in parts per million of device time (1_000_000 = the whole device).

/// The whole device, in parts per million.
pub const FULL: u32 = 1_000_000;

/// Headroom given to a slice that is not using all it was allotted: it may grow by this much
/// before it is throttled, and being throttled is what tells the others it wants more.
pub const SLACK: u32 = 50_000;

/// Whether a slice using `usage` of its allotment `allot` is using all of it, as far as readings
/// tell: within half of `SLACK`. Not within the whole of it: a slice that is not hungry wants
/// what it used plus `SLACK`, and if being allotted exactly that counted as using all of it, a
/// light slice would flip between hungry and not every half second, taking the device from a
/// heavy neighbour in turn (a 20% probe beside a busy best-effort slice held it at 50-75% with a
/// quarter of the device idle).
pub fn uses_all(usage: u32, allot: u32) -> bool {
    usage.saturating_add(SLACK / 2) >= allot
}

/// What a slice without a request is kept from starving with: before time nobody is guaranteed
/// is shared out, each such slice that wants time gets up to this much of what requests leave.
pub const FLOOR: u32 = 10_000;

/// One slice on a device, as the allotment sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    /// Guaranteed share under contention (0: best-effort).
    pub request: u32,
    /// Most the slice may ever use (FULL: no limit).
    pub limit: u32,
    /// Whether the slice was held back (its tokens ran out) in the last period: it wants more
    /// than it used.
    pub hungry: bool,
    /// What it used in the last period.
    pub usage: u32,
}

impl Demand {
    /// The most this slice can use now: its limit when it is held back, else what it used plus
    /// headroom.
    fn wants(&self) -> u32 {
        let w = if self.hungry {
            self.limit
        } else {
            self.usage.saturating_add(SLACK)
        };
        w.min(self.limit).min(FULL)
    }
}

/// Each slice's allotment, in order. Requests are honoured first (a slice that wants less than
/// its request gets what it wants, and the rest of its request is lent to others until it wants
/// it back); each slice without a request gets up to `FLOOR` of what requests leave, so that it
/// never starves; then time nobody is guaranteed goes to slices that want more in proportion to
/// their requests, up to their limits; then what is still free goes to slices without a request
/// in equal parts, up to what they want; and time nobody wants is shared equally, up to limits.
/// Never more than a slice's limit, and the allotments never add up to more than the device.
pub fn allot(slices: &[Demand]) -> Vec<u32> {
    let wants: Vec<u64> = slices.iter().map(|d| d.wants() as u64).collect();
    let mut got: Vec<u64> = slices
        .iter()
        .zip(&wants)
        .map(|(d, w)| (d.request as u64).min(*w))
        .collect();
    let granted: u64 = got.iter().sum();
    if granted > FULL as u64 {
        // Admission keeps requests within the device; should it not have, scale them down.
        for g in got.iter_mut() {
            *g = *g * FULL as u64 / granted;
        }
    }
    for (i, d) in slices.iter().enumerate() {
        let left = (FULL as u64).saturating_sub(got.iter().sum());
        if d.request == 0 {
            got[i] = (FLOOR as u64).min(wants[i]).min(left);
        }
    }
    let requesters: Vec<u64> = slices.iter().map(|d| d.request as u64).collect();
    fill(&mut got, &wants, &requesters);
    let equal: Vec<u64> = slices.iter().map(|d| u64::from(d.request == 0)).collect();
    fill(&mut got, &wants, &equal);
    // Time no slice wants: everyone may use it, up to their limits (a slice alone gets its
    // limit). Taken back as soon as another slice is held back (its `wants` grows).
    let limits: Vec<u64> = slices.iter().map(|d| d.limit.min(FULL) as u64).collect();
    fill(&mut got, &limits, &vec![1; slices.len()]);
    got.into_iter().map(|g| g.min(FULL as u64) as u32).collect()
}

/// Below this, what the driver saw a slice use is taken for nothing: its claim is passed over.
pub const SEEN_MIN: u32 = FLOOR;

/// Bounds other slices' claims by what the driver saw them use (the node agent's evidence,
/// `seen[i]`, ppm over its window; None where it says nothing; this slice's own, at index 0,
/// stands on its own). A claim is the slice's own word, so it counts for at most twice what the
/// driver saw: one without a request seen using less than `SEEN_MIN` is passed over (None), its
/// usage is cut to twice what was seen, and it counts as wanting more (hungry) only if it was seen
/// using at least half of what the allotment would give it. A request stands whatever was seen
/// (admission granted it, and a slice must have it at once when it wants it): what a slice with
/// one claims to use counts up to its request, and only its hunger beyond the request is in
/// question; unproven, it is given its request and headroom (`SLACK`). A slice that forges a
/// claim and leaves the device idle takes nothing from its neighbours beyond its request; one
/// that uses part of what it claims takes at most as much again. An honest slice that wants more
/// uses what it is allotted (it runs, whatever the others allot it: the driver time-slices them),
/// so the driver sees it, and its claim counts within the agent's window.
pub fn corroborate(slices: &[Demand], seen: &[Option<u32>]) -> Vec<Option<Demand>> {
    let cap = |s: u32| s.saturating_mul(2).min(FULL);
    let mut out: Vec<Option<Demand>> = slices
        .iter()
        .enumerate()
        .map(|(i, d)| match seen.get(i).copied().flatten() {
            Some(s) if i > 0 && d.request == 0 && s < SEEN_MIN => None,
            Some(s) if i > 0 => Some(Demand {
                usage: d.usage.min(cap(s).max(d.request)),
                ..*d
            }),
            _ => Some(*d),
        })
        .collect();
    let kept: Vec<Demand> = out.iter().flatten().copied().collect();
    let mut given = allot(&kept).into_iter();
    for (i, d) in out.iter_mut().enumerate() {
        let Some(d) = d else { continue };
        let got = given.next().unwrap_or(0);
        if let Some(s) = seen.get(i).copied().flatten()
            && i > 0
            && d.hungry
            && cap(s) < got
            && got > d.request
        {
            d.hungry = false;
            d.usage = d.usage.max(d.request);
        }
    }
    out
}

/// Water-fills what is left of the device among slices with a positive weight that want more,
/// in proportion to their weights, each up to what it wants.
fn fill(got: &mut [u64], wants: &[u64], weights: &[u64]) {
    loop {
        let left = (FULL as u64).saturating_sub(got.iter().sum());
        let open: Vec<usize> = (0..got.len())
            .filter(|&i| weights[i] > 0 && got[i] < wants[i])
            .collect();
        let total: u64 = open.iter().map(|&i| weights[i]).sum();
        if left == 0 || total == 0 {
            return;
        }
        let mut gave = 0;
        for &i in &open {
            let offer = (left * weights[i] / total).max(1);
            let take = offer.min(wants[i] - got[i]).min(left - gave);
            got[i] += take;
            gave += take;
        }
        if gave == 0 {
            return;
        }
    }
}

/// Device time (ns) a slice at `share` earns over `elapsed_ns`.
pub fn earned(share: u32, elapsed_ns: u64) -> i64 {
    (elapsed_ns as u128 * share as u128 / FULL as u128).min(i64::MAX as u128) as i64
}

/// How long a thread whose slice owes `debt_ns` of device time sleeps before looking again:
/// the time the slice needs to earn it back, within [200 us, 20 ms] so that a changed share or a
/// correction is noticed soon.
pub fn pause_ns(debt_ns: i64, share: u32) -> u64 {
    let need = if share == 0 {
        u64::MAX
    } else {
        (debt_ns.max(0) as u128 * FULL as u128 / share as u128).min(u64::MAX as u128) as u64
    };
    need.clamp(200_000, 20_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_given_what_it_wants_is_not_using_all_of_it() {
        let used = 200_000;
        assert!(!uses_all(used, used + SLACK));
        assert!(uses_all(used, used + SLACK / 2));
        assert!(uses_all(used, used));
        assert!(uses_all(FULL, FULL));
    }

    const P: u32 = FULL / 100;

    fn d(request: u32, limit: u32, hungry: bool, usage: u32) -> Demand {
        Demand {
            request: request * P,
            limit: limit * P,
            hungry,
            usage: usage * P,
        }
    }

    fn pct(v: Vec<u32>) -> Vec<u32> {
        v.into_iter().map(|x| (x + P / 2) / P).collect()
    }

    #[test]
    fn hard_limits_are_what_busy_slices_get() {
        assert_eq!(
            pct(allot(&[d(0, 30, true, 30), d(0, 70, true, 70)])),
            [30, 70]
        );
        assert_eq!(
            pct(allot(&[
                d(0, 20, true, 20),
                d(0, 30, true, 30),
                d(0, 50, true, 50)
            ])),
            [20, 30, 50]
        );
        assert_eq!(pct(allot(&[d(0, 25, true, 25); 4])), [25; 4]);
        assert_eq!(pct(allot(&[d(0, 30, true, 30)])), [30]);
    }

    #[test]
    fn requests_are_guaranteed_and_idle_time_goes_to_who_wants_it() {
        // A (request 30, limit 100) beside B (request 70, limit 70).
        let busy = allot(&[d(30, 100, true, 30), d(70, 70, true, 70)]);
        assert_eq!(pct(busy), [30, 70]);
        // B uses 10%: A may have what B leaves, less B's headroom.
        let light = allot(&[d(30, 100, true, 85), d(70, 70, false, 10)]);
        assert_eq!(pct(light), [85, 15]);
        // B gone: A alone.
        assert_eq!(pct(allot(&[d(30, 100, true, 100)])), [100]);
    }

    #[test]
    fn best_effort_uses_what_the_others_leave() {
        assert_eq!(
            pct(allot(&[d(0, 30, true, 30), d(0, 100, true, 70)])),
            [30, 70]
        );
        // Against a request, best effort gets the rest, but never less than FLOOR of what
        // requests leave.
        assert_eq!(
            pct(allot(&[d(60, 100, true, 60), d(0, 100, true, 40)])),
            [99, 1]
        );
        assert_eq!(
            pct(allot(&[d(100, 100, true, 100), d(0, 100, true, 0)])),
            [100, 0]
        );
        assert_eq!(
            pct(allot(&[d(60, 80, true, 60), d(0, 100, true, 40)])),
            [80, 20]
        );
        // Time nobody wants goes to everyone up to their limits: a slice alone gets its limit.
        assert_eq!(pct(allot(&[d(0, 100, false, 0)])), [100]);
        assert_eq!(pct(allot(&[d(0, 30, false, 0)])), [30]);
        assert_eq!(
            pct(allot(&[d(0, 100, false, 10), d(0, 40, false, 10)])),
            [60, 40]
        );
        // Two best-effort slices split the device.
        assert_eq!(
            pct(allot(&[d(0, 100, true, 50), d(0, 100, true, 50)])),
            [50, 50]
        );
    }

    #[test]
    fn spare_time_goes_in_proportion_to_requests() {
        let a = allot(&[d(10, 100, true, 10), d(30, 100, true, 30)]);
        assert_eq!(pct(a), [25, 75]);
    }

    #[test]
    fn never_more_than_the_device_or_a_limit() {
        for slices in [
            vec![d(50, 100, true, 0), d(50, 100, true, 0), d(0, 100, true, 0)],
            vec![d(0, 100, false, 90), d(0, 100, false, 90)],
            vec![d(0, 10, true, 90)],
            vec![d(100, 100, true, 100), d(100, 100, true, 100)],
        ] {
            let a = allot(&slices);
            assert!(
                a.iter().map(|&x| x as u64).sum::<u64>() <= FULL as u64,
                "{a:?}"
            );
            for (x, s) in a.iter().zip(&slices) {
                assert!(*x <= s.limit, "{a:?}");
            }
        }
    }

    #[test]
    fn token_arithmetic() {
        assert_eq!(earned(300_000, 1_000_000_000), 300_000_000);
        assert_eq!(pause_ns(3_000_000, 300_000), 10_000_000);
        assert_eq!(pause_ns(1, 300_000), 200_000);
        assert_eq!(pause_ns(i64::MAX, 1), 20_000_000);
        assert_eq!(pause_ns(10, 0), 20_000_000);
    }

    /// The allotment of slice 0 once the others' claims are bounded by what the driver saw.
    fn allot_seen(slices: &[Demand], seen: &[Option<u32>]) -> Vec<u32> {
        let kept: Vec<Demand> = corroborate(slices, seen).into_iter().flatten().collect();
        pct(allot(&kept))
    }

    #[test]
    fn a_claim_the_driver_never_saw_used_takes_nothing() {
        // Limits 30 and 70, busy, and a best-effort slice that claims to be hungry and using
        // the whole device: believed, it takes half of the 70.
        let forged = d(0, 100, true, 100);
        let (thirty, seventy) = (d(0, 30, true, 30), d(0, 70, true, 70));
        assert_eq!(pct(allot(&[seventy, thirty, forged])), [35, 30, 35]);
        // The driver saw the two at work and the forger idle: its claim is passed over.
        let seen = [None, Some(30 * P), Some(0)];
        assert_eq!(allot_seen(&[seventy, thirty, forged], &seen), [70, 30]);
        // Seen using 5%: it counts as using twice that, not as hungry, and is given headroom
        // as any slice is (`SLACK`), not half the device.
        let seen = [None, Some(30 * P), Some(5 * P)];
        assert_eq!(allot_seen(&[seventy, thirty, forged], &seen), [55, 30, 15]);
    }

    #[test]
    fn an_honest_claim_counts_as_it_did() {
        // A best-effort slice using the share it was given beside limits of 30 and 70: hungry,
        // by the driver's count too, it keeps its equal part.
        let honest = d(0, 100, true, 35);
        let seen = [None, Some(30 * P), Some(33 * P)];
        let (thirty, seventy) = (d(0, 30, true, 30), d(0, 70, true, 70));
        assert_eq!(
            allot_seen(&[seventy, thirty, honest], &seen),
            pct(allot(&[seventy, thirty, honest]))
        );
        // Where the agent says nothing (no agent, a standalone slice, a request), claims count
        // as they are.
        let none = [None, None, None];
        let claims = [seventy, d(50, 100, true, 20), d(0, 100, true, 100)];
        assert_eq!(allot_seen(&claims, &none), pct(allot(&claims)));
        // This slice's own claim is never in question, whatever the figure beside it.
        let alone = [d(0, 100, true, 100)];
        assert_eq!(allot_seen(&alone, &[Some(0)]), [100]);
    }

    #[test]
    fn a_request_stands_and_only_hunger_beyond_it_needs_the_driver() {
        // A slice granted a request of 20 and no limit, claiming to use the whole device and
        // want more: believed, it takes all that no request guarantees.
        let forged = d(20, 100, true, 100);
        let thirty = d(0, 30, true, 30);
        let best_effort = d(0, 100, true, 80);
        assert_eq!(pct(allot(&[thirty, forged])), [1, 99]);
        assert_eq!(pct(allot(&[best_effort, forged])), [1, 99]);
        // Seen idle: it keeps its request and headroom (25), the rest goes to the others.
        let seen = [None, Some(0)];
        assert_eq!(allot_seen(&[thirty, forged], &seen)[0], 30);
        assert_eq!(allot_seen(&[best_effort, forged], &seen), [75, 25]);
        // Seen using what it claims: its hunger counts as it did.
        let busy = [None, Some(50 * P)];
        assert_eq!(
            allot_seen(&[best_effort, forged], &busy),
            pct(allot(&[best_effort, forged]))
        );
        // Hungry for its request and seen idle (just started): it gets all of its request at
        // once, with a neighbour that wants everything.
        let starting = d(40, 40, true, 0);
        assert_eq!(allot_seen(&[best_effort, starting], &seen), [60, 40]);
        // Using less than its request and not hungry: the rest is lent as ever.
        let light = d(40, 100, false, 10);
        assert_eq!(
            allot_seen(&[best_effort, light], &seen),
            pct(allot(&[best_effort, light]))
        );
    }
}
