//! Pure: the answer NVIDIA's runtime expects from the driver's integrity-check table. Plain numbers
//! in, two 64-bit words out; `export.rs` gathers the numbers.
//!
//! The runtime asks three times, with its own version + 0, + 1 and + 2 (12090, 12091, 12092 for
//! CUDA 12.9). The first two answers are fixed constants. The third is HMAC-MD2 (MD2 as RFC 1319
//! defines it; HMAC with the usual 0x36 / 0x5c pads over MD2's 16-byte block) under a fixed 16-byte
//! key, of a packed 48-byte record followed by one 28-byte record per device. The constants and
//! the key are those the public reimplementations use (Ref: vosen/ZLUDA, `dark_api/src/lib.rs`).

/// The answers to the + 0 and + 1 calls.
const ANSWER_0: [u64; 2] = [0x3341_181C_03CB_675C, 0x8ED3_83AA_1F4C_D1E8];
const ANSWER_1: [u64; 2] = [0x1841_181C_03CB_675C, 0x8ED3_83AA_1F4C_D1E8];

/// The HMAC key of the + 2 call.
const KEY: [u8; 16] = [
    0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52, 0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A, 0x9F,
];

/// RFC 1319's substitution table (a permutation of 0..=255 built from the digits of pi).
#[rustfmt::skip]
const S: [u8; 256] = [
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19,
    98, 167, 5, 243, 192, 199, 115, 140, 152, 147, 43, 217, 188, 76, 130, 202,
    30, 155, 87, 60, 253, 212, 224, 22, 103, 66, 111, 24, 138, 23, 229, 18,
    190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47, 238, 122,
    169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33,
    128, 127, 93, 154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3,
    255, 25, 48, 179, 72, 165, 181, 209, 215, 94, 146, 42, 172, 86, 170, 198,
    79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226, 156, 116, 4, 241,
    69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2,
    27, 96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15,
    85, 71, 163, 35, 221, 81, 175, 58, 195, 92, 249, 206, 186, 197, 234, 38,
    44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205, 244, 65, 129, 77, 82,
    106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74,
    120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57,
    242, 239, 183, 14, 102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10,
    49, 68, 80, 180, 143, 237, 31, 26, 219, 153, 141, 51, 159, 17, 131, 20,
];

/// MD2 (RFC 1319), fed in pieces.
#[derive(Clone)]
pub struct Md2 {
    /// The 48-byte state; its first 16 bytes become the digest.
    x: [u8; 48],
    /// The running checksum.
    c: [u8; 16],
    /// The partial block and how much of it is filled.
    block: [u8; 16],
    n: usize,
}

impl Default for Md2 {
    fn default() -> Md2 {
        Md2 {
            x: [0; 48],
            c: [0; 16],
            block: [0; 16],
            n: 0,
        }
    }
}

impl Md2 {
    pub fn update(&mut self, data: &[u8]) {
        for &b in data {
            self.block[self.n] = b;
            self.n += 1;
            if self.n == 16 {
                self.compress();
                self.n = 0;
            }
        }
    }

    /// RFC 1319 steps 3.2 (checksum) and 3.4 (the block into the state).
    fn compress(&mut self) {
        let mut l = self.c[15];
        for j in 0..16 {
            self.c[j] ^= S[usize::from(self.block[j] ^ l)];
            l = self.c[j];
        }
        for j in 0..16 {
            self.x[16 + j] = self.block[j];
            self.x[32 + j] = self.block[j] ^ self.x[j];
        }
        let mut t = 0u8;
        for round in 0..18u8 {
            for k in 0..48 {
                self.x[k] ^= S[usize::from(t)];
                t = self.x[k];
            }
            t = t.wrapping_add(round);
        }
    }

    /// Pads (RFC 1319 step 3.1), appends the checksum (3.2) and returns the digest.
    pub fn finish(mut self) -> [u8; 16] {
        let pad = 16 - self.n as u8;
        self.update(&vec![pad; usize::from(pad)]);
        let c = self.c;
        self.update(&c);
        let mut out = [0; 16];
        out.copy_from_slice(&self.x[..16]);
        out
    }
}

#[cfg(test)]
pub fn md2(data: &[u8]) -> [u8; 16] {
    let mut h = Md2::default();
    h.update(data);
    h.finish()
}

/// HMAC-MD2 of `parts` (concatenated) under a key of exactly one block.
pub fn hmac_md2(key: &[u8; 16], parts: &[&[u8]]) -> [u8; 16] {
    let mut inner = Md2::default();
    inner.update(&key.map(|k| k ^ 0x36));
    for p in parts {
        inner.update(p);
    }
    let inner = inner.finish();
    let mut outer = Md2::default();
    outer.update(&key.map(|k| k ^ 0x5c));
    outer.update(&inner);
    outer.finish()
}

/// What the + 2 answer covers besides the devices.
#[derive(Clone, Copy, Debug)]
pub struct Record {
    /// As `cuDriverGetVersion` reports it.
    pub driver_version: u32,
    /// The version argument of the call.
    pub version: u32,
    pub pid: u32,
    /// The low half of `pthread_self()`.
    pub thread: u32,
    /// Addresses of the runtime-interface table, the integrity table and the called function.
    pub cudart_table: u64,
    pub integrity_table: u64,
    pub function: u64,
    /// The seconds argument of the call.
    pub seconds: u64,
}

impl Record {
    /// The packed 48-byte form (native byte order, as the runtime lays it out).
    fn bytes(&self) -> [u8; 48] {
        let mut b = [0u8; 48];
        b[0..4].copy_from_slice(&self.driver_version.to_ne_bytes());
        b[4..8].copy_from_slice(&self.version.to_ne_bytes());
        b[8..12].copy_from_slice(&self.pid.to_ne_bytes());
        b[12..16].copy_from_slice(&self.thread.to_ne_bytes());
        b[16..24].copy_from_slice(&self.cudart_table.to_ne_bytes());
        b[24..32].copy_from_slice(&self.integrity_table.to_ne_bytes());
        b[32..40].copy_from_slice(&self.function.to_ne_bytes());
        b[40..48].copy_from_slice(&self.seconds.to_ne_bytes());
        b
    }
}

/// One device as the answer covers it.
#[derive(Clone, Copy, Debug)]
pub struct DeviceRecord {
    pub uuid: [u8; 16],
    pub pci_domain: i32,
    pub pci_bus: i32,
    pub pci_device: i32,
}

impl DeviceRecord {
    fn bytes(&self) -> [u8; 28] {
        let mut b = [0u8; 28];
        b[..16].copy_from_slice(&self.uuid);
        b[16..20].copy_from_slice(&self.pci_domain.to_ne_bytes());
        b[20..24].copy_from_slice(&self.pci_bus.to_ne_bytes());
        b[24..28].copy_from_slice(&self.pci_device.to_ne_bytes());
        b
    }
}

/// The answer to a call with `r.version`: constants for + 0 and + 1, HMAC-MD2 otherwise.
pub fn answer(r: &Record, devices: &[DeviceRecord]) -> [u64; 2] {
    match r.version % 10 {
        0 => return ANSWER_0,
        1 => return ANSWER_1,
        _ => {}
    }
    let head = r.bytes();
    let devs: Vec<[u8; 28]> = devices.iter().map(DeviceRecord::bytes).collect();
    let mut parts: Vec<&[u8]> = vec![&head];
    parts.extend(devs.iter().map(|d| &d[..]));
    let mac = hmac_md2(&KEY, &parts);
    let (lo, hi) = mac.split_at(8);
    [
        u64::from_ne_bytes(lo.try_into().unwrap_or_default()),
        u64::from_ne_bytes(hi.try_into().unwrap_or_default()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(d: [u8; 16]) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn md2_matches_rfc_1319_test_suite() {
        let cases = [
            ("", "8350e5a3e24c153df2275c9f80692773"),
            ("a", "32ec01ec4a6dac72c0ab96fb34c0b5d1"),
            ("abc", "da853b0d3f88d99b30283a69e6ded6bb"),
            ("message digest", "ab4f496bfb2a530b219ff33031fe06b0"),
            (
                "abcdefghijklmnopqrstuvwxyz",
                "4e8ddff3650292ab5a4108c3aa47940b",
            ),
            (
                "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
                "da33def2a42df13975352846c30338cd",
            ),
            (
                "12345678901234567890123456789012345678901234567890123456789012345678901234567890",
                "d5976f79d83d3a0dc9806c3c66f3efd8",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(hex(md2(input.as_bytes())), want, "MD2({input:?})");
        }
    }

    #[test]
    fn md2_in_pieces_equals_md2_at_once() {
        let data: Vec<u8> = (0..100u8).collect();
        for split in [0, 1, 15, 16, 17, 48, 99, 100] {
            let mut h = Md2::default();
            h.update(&data[..split]);
            h.update(&data[split..]);
            assert_eq!(h.finish(), md2(&data), "split at {split}");
        }
    }

    #[test]
    fn hmac_is_two_md2_passes_over_padded_keys() {
        let key = [7u8; 16];
        let msg = b"some message";
        let mut inner = key.map(|k| k ^ 0x36).to_vec();
        inner.extend_from_slice(msg);
        let mut outer = key.map(|k| k ^ 0x5c).to_vec();
        outer.extend_from_slice(&md2(&inner));
        assert_eq!(hmac_md2(&key, &[&msg[..4], &msg[4..]]), md2(&outer));
    }

    fn record(version: u32) -> Record {
        Record {
            driver_version: 13000,
            version,
            pid: 1234,
            thread: 0xf79c_1000,
            cudart_table: 0x7fff_f695_8240,
            integrity_table: 0x7fff_f695_8220,
            function: 0x7fff_f2aa_f4a0,
            seconds: 0x682b_9cee,
        }
    }

    #[test]
    fn first_two_calls_answer_constants_and_the_third_covers_every_field() {
        let dev = DeviceRecord {
            uuid: [1; 16],
            pci_domain: 0,
            pci_bus: 2,
            pci_device: 0,
        };
        assert_eq!(answer(&record(12090), &[dev]), ANSWER_0);
        assert_eq!(answer(&record(13051), &[dev]), ANSWER_1);
        let base = answer(&record(12092), &[dev]);
        assert_eq!(base, answer(&record(12092), &[dev]), "deterministic");
        let mut other = record(12092);
        other.seconds += 1;
        assert_ne!(answer(&other, &[dev]), base);
        let mut moved = dev;
        moved.pci_bus = 3;
        assert_ne!(answer(&record(12092), &[moved]), base);
        assert_ne!(answer(&record(12092), &[dev, dev]), base);
    }

    #[test]
    fn records_pack_to_their_c_layout() {
        let r = record(12092).bytes();
        assert_eq!(r.len(), 48);
        assert_eq!(&r[4..8], &12092u32.to_ne_bytes());
        assert_eq!(&r[40..48], &0x682b_9ceeu64.to_ne_bytes());
    }
}
