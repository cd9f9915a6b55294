use super::memory::{mipmap_side, round_up};
use super::threads::{StartLine, churn_size};
use super::*;

#[test]
fn nearest_rank_picks_from_the_sorted_values() {
    let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0];
    assert_eq!(nearest_rank(&v, 0.0), Some(1.0));
    assert_eq!(nearest_rank(&v, 0.1), Some(2.0));
    assert_eq!(nearest_rank(&v, 0.5), Some(6.0));
    assert_eq!(nearest_rank(&v, 1.0), Some(11.0));
    assert_eq!(nearest_rank::<u64>(&[], 0.5), None);
    assert_eq!(nearest_rank(&[7u64], 0.99), Some(7));
}

#[test]
fn uuid_format() {
    let u = CUuuid {
        bytes: [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8,
        ],
    };
    assert_eq!(format_uuid(&u), "GPU-12345678-9abc-def0-0102-030405060708");
}

#[test]
fn mipmap_side_is_a_power_of_two_within_the_chunk() {
    assert_eq!(mipmap_side(64 << 20), 4096);
    assert_eq!(mipmap_side(100 << 20), 4096);
    assert_eq!(mipmap_side(0), 1);
    for chunk in [1u64, 4, 1000, 1 << 20, 3 << 30] {
        let side = mipmap_side(chunk);
        assert!(side.is_power_of_two());
        assert!(side * side * 4 <= chunk.max(4), "{chunk}");
    }
}

#[test]
fn pattern_is_reproducible_and_not_trivial() {
    let p = pattern(1001, 7);
    assert_eq!(p.len(), 1001);
    assert_eq!(p, pattern(1001, 7));
    assert_ne!(p, pattern(1001, 8));
    assert!(p.iter().filter(|&&b| b == p[0]).count() < 100);
}

#[test]
fn churn_sizes_stay_in_range() {
    let mut rng = Rng::seeded(3);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..10_000 {
        let size = churn_size(&mut rng, 3 * MIB - 5, 8 * MIB);
        assert!(
            (3 * MIB..=8 * MIB).contains(&size) && size.is_multiple_of(MIB),
            "{size}"
        );
        seen.insert(size);
    }
    assert_eq!(seen.len(), 6);
    assert_eq!(churn_size(&mut rng, 4 * MIB, 4 * MIB), 4 * MIB);
    for _ in 0..1000 {
        let size = churn_size(&mut rng, 1000, 5000);
        assert!((1000..=5000).contains(&size), "{size}");
    }
    assert_eq!(churn_size(&mut rng, 7, 7), 7);
}

#[test]
fn seeded_generators_differ_and_repeat() {
    let a: Vec<u64> = (0..4).scan(Rng::seeded(1), |r, _| Some(r.next())).collect();
    let b: Vec<u64> = (0..4).scan(Rng::seeded(1), |r, _| Some(r.next())).collect();
    let c: Vec<u64> = (0..4).scan(Rng::seeded(2), |r, _| Some(r.next())).collect();
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn start_line_releases_everyone_or_fails() {
    let line = StartLine::new(3);
    std::thread::scope(|s| {
        let waiters: Vec<_> = (0..2).map(|_| s.spawn(|| line.arrive())).collect();
        assert!(line.arrive());
        assert!(waiters.into_iter().all(|h| h.join().unwrap()));
    });
    let line = StartLine::new(3);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| line.arrive());
        line.fail();
        assert!(!waiter.join().unwrap());
    });
}

#[test]
fn rounding() {
    assert_eq!(round_up(1, 2 << 20), 2 << 20);
    assert_eq!(round_up(4 << 20, 2 << 20), 4 << 20);
    assert_eq!(round_up(5, 0), 5);
}
