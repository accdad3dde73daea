//! When the publishing connection's acks wake pgoutbox: the socket's receive low-water mark
//! (`SO_RCVLOWAT`).
//!
//! Every message is answered by an ack of about 90 bytes. Read as it arrives, each one costs
//! a wake-up of the runtime (`epoll_wait` returning, often a context switch) and a `recv`:
//! at 3,000 single-row transactions a second, that was a third of pgoutbox's system calls
//! (docs/performance.md, issue 31). Yet nothing needs an ack the moment it arrives: the
//! message is stored whenever JetStream stored it, and what the ack moves (the position
//! confirmed to Postgres) is reported at most every 10 ms anyway. So between the moments the
//! pipeline wants its acks, the mark is raised: Linux then wakes no reader until
//! [`RAISED`] bytes wait, or the connection ends or fails. When the pipeline wants its acks
//! (each status cadence, a full window, a drain), the mark is lowered to one byte, which
//! wakes the reader at once if anything waits (Linux checks the mark when it is set), and it
//! is raised again once a read took what was there.
//!
//! The mark is set on a duplicate of the connection's descriptor, which names the same
//! socket, so that it does not matter what is layered on it (TLS). A failure to set it
//! leaves it lowered for good: acks then wake the reader as they arrive, as before.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

/// The mark between pulls: about 180 acks. Reached before the next pull only above about
/// 18,000 acks a second, where reads of that size cost little per ack anyway; well below
/// what a full window of acks holds (4,096 messages), so a window fills no later for it.
pub const RAISED: usize = 16 * 1024;

/// The receive low-water mark of one TCP socket.
pub struct LowWater {
    socket: OwnedFd,
    /// The mark last set (Linux's default is 1).
    current: usize,
    /// Setting it failed once: it stays at 1.
    broken: bool,
}

impl LowWater {
    /// Takes a duplicate of `socket`'s descriptor; its mark is Linux's default, 1 byte.
    pub fn of(socket: BorrowedFd<'_>) -> io::Result<LowWater> {
        Ok(LowWater { socket: socket.try_clone_to_owned()?, current: 1, broken: false })
    }

    /// Whether a reader is woken by each byte that arrives.
    pub fn is_lowered(&self) -> bool {
        self.current == 1
    }

    /// Wakes the reader by whatever arrives (and at once, if anything waits).
    pub fn lower(&mut self) {
        self.set(1);
    }

    /// Wakes the reader only once [`RAISED`] bytes wait (or the connection ends).
    pub fn raise(&mut self) {
        if !self.broken {
            self.set(RAISED);
        }
    }

    fn set(&mut self, bytes: usize) {
        if self.current == bytes {
            return;
        }
        match set_rcvlowat(&self.socket, bytes) {
            Ok(()) => self.current = bytes,
            Err(err) => {
                tracing::warn!(%err, "cannot set SO_RCVLOWAT on the publishing connection; \
                    every ack wakes pgoutbox as it arrives");
                self.broken = true;
                if bytes != 1 && set_rcvlowat(&self.socket, 1).is_ok() {
                    self.current = 1;
                }
            }
        }
    }
}

fn set_rcvlowat(socket: &OwnedFd, bytes: usize) -> io::Result<()> {
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: `socket` is an open descriptor owned for the duration of the call, and the
    // option value points to a `c_int` that lives across it, its size passed with it.
    let done = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&raw const value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if done == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;
    use std::time::{Duration, Instant};

    fn readable(socket: &TcpStream) -> bool {
        let mut fds = libc::pollfd { fd: socket.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, its count 1.
        let ready = unsafe { libc::poll(&mut fds, 1, 0) };
        ready == 1 && fds.revents & libc::POLLIN != 0
    }

    /// The bytes received and not read, whatever the mark.
    fn waiting(socket: &TcpStream) -> libc::c_int {
        let mut bytes: libc::c_int = 0;
        // SAFETY: FIONREAD writes one `c_int` through the pointer given.
        let done = unsafe { libc::ioctl(socket.as_raw_fd(), libc::FIONREAD, &raw mut bytes) };
        assert_eq!(done, 0, "FIONREAD");
        bytes
    }

    /// Below the raised mark the socket does not poll readable; lowering the mark makes what
    /// waits readable at once, and a read still takes all of it.
    #[test]
    fn a_raised_mark_holds_small_reads_back_until_lowered() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut sender = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut receiver, _) = listener.accept().unwrap();
        let mut mark = LowWater::of(receiver.as_fd()).unwrap();
        mark.raise();
        assert!(!mark.is_lowered());
        sender.write_all(&[b'a'; 100]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while waiting(&receiver) < 100 {
            assert!(Instant::now() < deadline, "the bytes never arrived");
            std::thread::yield_now();
        }
        assert!(!readable(&receiver), "100 bytes are below the raised mark");
        mark.lower();
        assert!(readable(&receiver), "lowered, the waiting bytes are readable");
        receiver.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 4096];
        assert_eq!(receiver.read(&mut buf).unwrap(), 100);
    }
}
