//! Reading one exported constant out of a shared object without loading it: the SPANK plugin's
//! `plugin_version` (its undefined symbols come from slurmd, so it cannot be loaded here without
//! slurmd's symbols). Pure: the file's bytes in.

/// The value of the 4-byte constant that the 64-bit little-endian ELF file `b` exports as the
/// dynamic symbol `name`. Err: one line saying why it cannot be read.
pub fn exported_u32(b: &[u8], name: &str) -> Result<u32, String> {
    let u16_at = |o: usize| b.get(o..o + 2).map(|s| u16::from_le_bytes([s[0], s[1]]));
    let u32_at = |o: usize| {
        b.get(o..o + 4)
            .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    };
    let u64_at = |o: usize| -> Option<usize> {
        let s: [u8; 8] = b.get(o..o + 8)?.try_into().ok()?;
        usize::try_from(u64::from_le_bytes(s)).ok()
    };
    let bad = || "not a 64-bit little-endian ELF shared object".to_owned();
    if !b.starts_with(b"\x7fELF") || b.get(4) != Some(&2) || b.get(5) != Some(&1) {
        return Err(bad());
    }
    let shoff = u64_at(0x28).ok_or_else(bad)?;
    let shentsize = usize::from(u16_at(0x3a).ok_or_else(bad)?);
    let shnum = usize::from(u16_at(0x3c).ok_or_else(bad)?);
    if shentsize < 0x40 {
        return Err(bad());
    }
    // A section header: (type, addr, offset, size, link, entsize).
    let section = |i: usize| -> Option<(u32, usize, usize, usize, usize, usize)> {
        let h = shoff.checked_add(i.checked_mul(shentsize)?)?;
        Some((
            u32_at(h + 4)?,
            u64_at(h + 0x10)?,
            u64_at(h + 0x18)?,
            u64_at(h + 0x20)?,
            u32_at(h + 0x28)? as usize,
            u64_at(h + 0x38)?,
        ))
    };
    const SHT_DYNSYM: u32 = 11;
    const SHT_NOBITS: u32 = 8;
    let (_, _, sym_off, sym_size, link, entsize) = (0..shnum)
        .filter_map(section)
        .find(|s| s.0 == SHT_DYNSYM)
        .ok_or_else(|| "has no dynamic symbol table".to_owned())?;
    let (_, _, str_off, str_size, _, _) = section(link).ok_or_else(bad)?;
    let strings = b
        .get(str_off..str_off.saturating_add(str_size))
        .ok_or_else(bad)?;
    let entsize = if entsize >= 24 { entsize } else { 24 };
    let missing = || format!("exports no {name}");
    for i in 0..sym_size / entsize {
        let e = sym_off + i * entsize;
        let Some(n) = u32_at(e) else { break };
        let Some(rest) = strings.get(n as usize..) else {
            continue;
        };
        let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
        if &rest[..end] != name.as_bytes() {
            continue;
        }
        let shndx = usize::from(u16_at(e + 6).ok_or_else(bad)?);
        let value = u64_at(e + 8).ok_or_else(bad)?;
        // Undefined (0) or special (ABS, COMMON: 0xfff1, 0xfff2): no bytes in the file.
        if shndx == 0 || shndx >= 0xff00 {
            return Err(missing());
        }
        let (kind, addr, off, size, _, _) = section(shndx).ok_or_else(bad)?;
        if kind == SHT_NOBITS {
            // Zero-initialised (.bss).
            return Ok(0);
        }
        let within = value
            .checked_sub(addr)
            .filter(|d| d + 4 <= size)
            .ok_or_else(|| format!("{name} lies outside its section"))?;
        return u32_at(off + within).ok_or_else(bad);
    }
    Err(missing())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_elf() {
        assert!(exported_u32(b"fake libcuslice_spank.so\n", "plugin_version").is_err());
        assert!(exported_u32(b"\x7fELF\x02\x01", "plugin_version").is_err());
    }

    /// A shared object built here with the C compiler (skipped without one).
    #[test]
    fn reads_a_constant_from_a_shared_object() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("p.c");
        let so = dir.path().join("p.so");
        std::fs::write(
            &src,
            "const unsigned int plugin_version = 0x160508;\n\
             const unsigned int zero_version = 0;\n\
             const char plugin_name[] = \"cuslice\";\n\
             extern int spank_get_item(void);\n\
             int use(void) { return spank_get_item(); }\n",
        )
        .expect("write");
        let built = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&so)
            .arg(&src)
            .status();
        if !built.is_ok_and(|s| s.success()) {
            eprintln!("skipped: no C compiler");
            return;
        }
        let b = std::fs::read(&so).expect("read");
        assert_eq!(exported_u32(&b, "plugin_version"), Ok(0x160508));
        assert_eq!(exported_u32(&b, "zero_version"), Ok(0));
        assert_eq!(
            exported_u32(&b, "spank_get_item"),
            Err("exports no spank_get_item".to_owned())
        );
        assert_eq!(
            exported_u32(&b, "nothing"),
            Err("exports no nothing".to_owned())
        );
    }
}
