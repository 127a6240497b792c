//! What a running process costs, read from `/proc`: its resident memory
//! ([`rss_bytes`]) and the CPU time it has used ([`cpu_seconds`]).

/// The resident memory of process `pid`, in bytes (`None` if it is gone).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// CPU seconds (user + system) the processes `pids` have used so far.
pub fn cpu_seconds(pids: &[u32]) -> f64 {
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|stat| {
            // Fields after the parenthesised command name; utime and stime
            // are the 14th and 15th fields of the whole line.
            let rest = stat.rsplit_once(") ")?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let utime: f64 = fields.get(11)?.parse().ok()?;
            let stime: f64 = fields.get(12)?.parse().ok()?;
            Some((utime + stime) / 100.0)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_memory_and_has_used_cpu() {
        let me = std::process::id();
        let rss = rss_bytes(me).expect("this process's RSS");
        assert!(rss > 1 << 20, "{rss} bytes resident");
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(50) {}
        assert!(cpu_seconds(&[me]) > 0.0);
        assert_eq!(rss_bytes(u32::MAX), None);
    }
}
