//! Free TCP ports on 127.0.0.1.

use std::net::TcpListener;
use std::sync::Mutex;

/// The last port handed out in this process, so parallel tests never pick
/// the same free port twice. A std mutex: the critical section is a few
/// binds, never awaits, and runs outside any runtime as well.
static NEXT_PORT: Mutex<u16> = Mutex::new(0);

/// A free port on 127.0.0.1 (checked by binding it), never one this
/// process handed out before.
pub fn free_port() -> u16 {
    let mut next = NEXT_PORT.lock().unwrap_or_else(|e| e.into_inner());
    if *next == 0 {
        // Start from a spread based on the pid so concurrent test binaries
        // rarely collide; the bind check below settles the rest.
        *next = 20_000 + (std::process::id() % 20_000) as u16;
    }
    loop {
        *next = if *next >= 60_000 { 20_000 } else { *next + 1 };
        if TcpListener::bind(("127.0.0.1", *next)).is_ok() {
            return *next;
        }
    }
}
