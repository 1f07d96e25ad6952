//! Sizes that come from input (gradients in a vector, routes to generate, ...) are checked
//! against the memory this machine has **before** anything is allocated, so a typo like
//! `--gradients 1000000000` is refused with a message naming the option instead of aborting
//! on allocation, or swapping for minutes.
//!
//! The bound is the kernel's estimate of memory available without swapping (`MemAvailable`
//! in `/proc/meminfo`); where that cannot be read, [`FALLBACK_BYTES`].

use crate::error::ConfigError;

/// The bound used where `/proc/meminfo` cannot be read: 8 GiB.
pub const FALLBACK_BYTES: u64 = 8 << 30;

/// Memory available to allocate, in bytes, and where the figure comes from.
pub fn available_memory() -> (u64, &'static str) {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_available(&text))
        .map_or(
            (
                FALLBACK_BYTES,
                "pfemu's limit where /proc/meminfo cannot be read",
            ),
            |b| (b, "MemAvailable in /proc/meminfo"),
        )
}

/// `MemAvailable` from the text of `/proc/meminfo`, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut words = line.split_whitespace().skip(1);
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => n.checked_mul(1024),
        None => Some(n),
        Some(_) => None,
    }
}

/// Bytes in the unit that reads best (B, KiB, MiB, GiB, TiB).
pub fn fmt_bytes(bytes: u128) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Refuses `setting` when `count` items of `bytes_each` bytes do not fit in the memory
/// available (see the module docs); `what` names the items (e.g. "gradients").
pub fn check_fits(
    setting: &'static str,
    count: u64,
    what: &str,
    bytes_each: u64,
) -> Result<(), ConfigError> {
    let needed = u128::from(count) * u128::from(bytes_each);
    let (available, source) = available_memory();
    if needed > u128::from(available) {
        return Err(ConfigError::new(
            setting,
            format!(
                "{count} {what} need about {} of memory, but {} is available ({source})",
                fmt_bytes(needed),
                fmt_bytes(u128::from(available))
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_in_bytes() {
        let text = "MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:   12000000 kB\n";
        assert_eq!(mem_available(text), Some(12_000_000 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: lots kB\n"), None);
    }

    #[test]
    fn too_much_is_refused_naming_the_setting() {
        assert!(check_fits("gradients", 1000, "gradients", 4).is_ok());
        let e = check_fits("gradients", u64::MAX, "gradients", 64).unwrap_err();
        assert_eq!(e.setting, "gradients");
        assert!(e.reason.contains("memory"), "{e}");
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(3 << 30), "3.0 GiB");
    }
}
