//! The allocation table under racing threads.

use super::*;

fn charge(bytes: u64) -> Charge {
    Charge {
        dev: 0,
        bytes,
        ctx: 1,
    }
}

#[test]
fn racing_threads_each_get_back_exactly_their_own_charges() {
    // Pointers unique to this test (the table is the process's).
    let ptr = |t: u64, i: u64| (0x7e00_0000_0000 + (t << 32)) | i << 21;
    std::thread::scope(|s| {
        for t in 0..8 {
            s.spawn(move || {
                for round in 0..20 {
                    for i in 0..500 {
                        assert!(alloc_insert(ptr(t, i), charge(i + round)).is_none());
                    }
                    for i in 0..500 {
                        let c = alloc_remove(ptr(t, i)).map(|c| c.bytes);
                        assert_eq!(c, Some(i + round));
                        assert!(alloc_remove(ptr(t, i)).is_none());
                    }
                }
            });
        }
    });
}

#[test]
fn a_pointer_freed_twice_at_once_is_given_back_once() {
    for i in 0..2000u64 {
        let p = 0x7f00_0000_0000 | i << 21;
        alloc_insert(p, charge(1));
        let got: u32 = std::thread::scope(|s| {
            let a = s.spawn(|| u32::from(alloc_remove(p).is_some()));
            let b = s.spawn(|| u32::from(alloc_remove(p).is_some()));
            a.join().unwrap() + b.join().unwrap()
        });
        assert_eq!(got, 1);
    }
}
