//! Free TCP ports on 127.0.0.1.
//!
//! Ports are chosen BELOW the kernel's ephemeral range
//! (`net.ipv4.ip_local_port_range`, 32768-60999 by default). A port in that
//! range can be taken between "it was free" and "the server binds it" by any
//! outgoing connection of any process on the machine (CI saw exactly that:
//! `binding --client-addr 127.0.0.1:48550: Address already in use`). Below it
//! only another listener can take a port, and those are ours.

use std::net::TcpListener;
use std::sync::Mutex;

/// The lowest port handed out.
const LOWEST: u16 = 10_000;

/// The last port handed out in this process, so parallel tests never pick
/// the same free port twice. A std mutex: the critical section is a few
/// binds, never awaits, and runs outside any runtime as well.
static NEXT_PORT: Mutex<u16> = Mutex::new(0);

/// A free port on 127.0.0.1 (checked by binding it), below the ephemeral
/// range and never one this process handed out before.
pub fn free_port() -> u16 {
    let highest = ephemeral_low().saturating_sub(1).max(LOWEST + 1_000);
    let span = highest - LOWEST;
    let mut next = NEXT_PORT.lock().unwrap_or_else(|e| e.into_inner());
    if *next == 0 {
        // Start from a spread based on the pid so concurrent processes
        // rarely collide; the bind check below settles the rest. Hashed:
        // processes started together have neighbouring pids, and with the
        // pid itself as the start their sequences overlapped (two
        // `latchkey-loadtest cluster up` at once bound one port twice).
        let spread = u64::from(std::process::id()).wrapping_mul(2_654_435_761);
        *next = LOWEST + (spread % u64::from(span)) as u16;
    }
    loop {
        *next = if *next >= highest { LOWEST } else { *next + 1 };
        if TcpListener::bind(("127.0.0.1", *next)).is_ok() {
            return *next;
        }
    }
}

/// The first port of the kernel's ephemeral range (32768 where it cannot
/// be read).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_below_the_ephemeral_range() {
        let low = ephemeral_low();
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "a port was handed out twice");
        assert!(
            ports.iter().all(|p| (LOWEST..low).contains(p)),
            "{ports:?} not all in {LOWEST}..{low}"
        );
    }
}
