//! The process's peak resident memory, for `starling bench` (memory for a
//! flock of a given size). Linux only (`/proc/self`); elsewhere `None`.

/// Resets the peak so that the next [`peak_mib`] covers only what follows
/// (writing `5` to `/proc/self/clear_refs`, Linux ≥ 4.0). Whether it could:
/// when not, the peak is the process's since it started.
pub fn reset() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The peak resident set (`VmHWM`) in MiB since start or the last
/// [`reset`]; `None` where `/proc/self/status` does not exist.
pub fn peak_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_hwm_kib(&status).map(|kib| kib as f64 / 1024.0)
}

/// The `VmHWM:` line of a `/proc/PID/status` text, in KiB.
fn parse_hwm_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_high_water_mark_line() {
        let status = "Name:\tstarling\nVmPeak:\t  900 kB\nVmHWM:\t   151236 kB\nVmRSS:\t 2 kB\n";
        assert_eq!(parse_hwm_kib(status), Some(151_236));
        assert_eq!(parse_hwm_kib("VmRSS:\t 2 kB\n"), None);
        assert_eq!(parse_hwm_kib("VmHWM:\t lots kB\n"), None);
    }

    #[test]
    fn the_peak_covers_touched_memory() {
        reset();
        let Some(_) = peak_mib() else {
            return; // not Linux: nothing to read
        };
        let big = vec![1u8; 64 << 20];
        std::hint::black_box(&big);
        // Whatever else runs alongside, the peak holds at least this buffer.
        let peak = peak_mib().expect("read once, reads again");
        assert!(peak >= 64.0, "peak {peak} MiB with 64 MiB touched");
    }
}
