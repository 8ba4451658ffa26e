//! Waking the other end of a ring: a byte on the data stream's TCP socket, which the sleeper
//! waits for in epoll like any socket. A rank rings only when the other end said it is about to
//! sleep, so a busy ring costs no system calls; and a peer that dies closes its socket, which
//! wakes the sleeper with end-of-stream.

use std::future::Future;
use std::io::ErrorKind;

use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// What woke a sleeper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// The other end rang (or a byte was pending from an earlier ring).
    Rung,
    /// The other end closed its side of the stream (or its process ended).
    Closed,
}

/// One end's way to wake the other and to sleep until woken.
pub(crate) trait Bell {
    /// Wakes the other end (best effort: a full socket already holds a pending ring).
    fn ring(&self);
    /// Sleeps until the other end rings or closes; an error is the socket's failure.
    fn wait(&self) -> impl Future<Output = Result<Wake, String>>;
}

/// The sending rank's end: rings on its write half, sleeps on its read half.
pub(crate) struct LinkBell<'a> {
    pub(crate) read: &'a OwnedReadHalf,
    pub(crate) write: &'a OwnedWriteHalf,
}

impl Bell for LinkBell<'_> {
    fn ring(&self) {
        let _ = self.write.try_write(&[1]);
    }

    async fn wait(&self) -> Result<Wake, String> {
        loop {
            self.read.readable().await.map_err(|e| e.to_string())?;
            if let Some(wake) = drained(self.read.try_read(&mut [0u8; 64])) {
                return wake;
            }
        }
    }
}

/// The receiving rank's end: the whole admitted stream.
impl Bell for TcpStream {
    fn ring(&self) {
        let _ = self.try_write(&[1]);
    }

    async fn wait(&self) -> Result<Wake, String> {
        loop {
            self.readable().await.map_err(|e| e.to_string())?;
            if let Some(wake) = drained(self.try_read(&mut [0u8; 64])) {
                return wake;
            }
        }
    }
}

/// What a non-blocking read of pending rings says; `None`: nothing yet, wait again.
fn drained(read: std::io::Result<usize>) -> Option<Result<Wake, String>> {
    match read {
        Ok(0) => Some(Ok(Wake::Closed)),
        Ok(_) => Some(Ok(Wake::Rung)),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => None,
        Err(e) => Some(Err(e.to_string())),
    }
}
