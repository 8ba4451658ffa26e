//! Handing a segment's descriptor to the peer that takes the ring: over a unix socket with
//! `SCM_RIGHTS`, the kernel copying the descriptor into the receiving process, so the memory is
//! never named anywhere a third process could open it.
//!
//! Each rank that offers rings serves one socket and keeps each offered segment's descriptor under
//! its nonce. The socket is in the abstract namespace (`@rdu-rings-<random>`; no file, gone with the
//! process) for ranks of one host and network namespace, or a file `rdu-rings-<random>` in a
//! directory the ranks share ([`RingPlace::Dir`]: pods of one job on one node, whose network
//! namespaces keep abstract sockets apart, given the same directory by the DRA plugin). The
//! hello offering a ring names the socket and the nonce; the receiving rank, having checked the
//! hello's job token, connects and sends the nonce, and gets the descriptor back. Both ends check
//! that the other runs as their own user (`SO_PEERCRED`). The nonce proves the asker is the rank
//! the hello went to (it travelled only in that hello), the socket named in that token-checked
//! hello proves the giver is the rank that sent it, and the segment itself holds the nonce
//! again (`Segment::attach` checks). Why not `/proc/PID/fd/N`: the receiver would open a path a
//! peer chose, needs to see the sender's `/proc` (a pid namespace or `hidepid` hides it), and
//! nothing would stop any process of the user from opening the same path.

use std::collections::HashMap;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::segment::Nonce;
use crate::config::RingPlace;

/// Random bytes naming one rank's socket.
pub(crate) type ServerId = [u8; 16];

/// Askers served at once; more wait in the listen backlog.
const MAX_ASKERS: usize = 64;
/// Longest an asker may take to send its nonce.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a descriptor could not be fetched.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PassError {
    #[error("cannot reach the sender's ring socket")]
    Connect(#[source] io::Error),
    #[error("asking the sender's ring socket failed")]
    Io(#[source] io::Error),
    #[error("the ring socket is served by user {0}, not this rank's user")]
    OtherUser(u32),
    #[error("the sender has no ring under that nonce (already taken, or withdrawn)")]
    Unknown,
    #[error("the sender's answer carried {0} descriptors, not one")]
    Descriptors(usize),
}

/// The address of server `id`'s socket in `place`: an abstract name (leading NUL) or a path.
fn address(place: &RingPlace, id: &ServerId) -> PathBuf {
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let name = format!("rdu-rings-{hex}");
    match place {
        RingPlace::Abstract => PathBuf::from(format!("\0{name}")),
        RingPlace::Dir(dir) => dir.join(name),
    }
}

/// This rank's socket for handing out offered segments, and the segments offered.
pub(crate) struct RingServer {
    id: ServerId,
    offered: Arc<Mutex<HashMap<Nonce, OwnedFd>>>,
    task: JoinHandle<()>,
    /// The socket's file, removed with the server ([`RingPlace::Dir`]).
    file: Option<PathBuf>,
}

impl RingServer {
    /// Binds a fresh socket in `place` and serves it until dropped.
    pub(crate) fn start(place: &RingPlace) -> io::Result<RingServer> {
        let (id, listener) = bind_fresh(place)?;
        let offered: Arc<Mutex<HashMap<Nonce, OwnedFd>>> = Arc::default();
        let task =
            tokio::spawn(serve(listener, offered.clone()).instrument(tracing::Span::current()));
        let file = matches!(place, RingPlace::Dir(_)).then(|| address(place, &id));
        Ok(RingServer {
            id,
            offered,
            task,
            file,
        })
    }

    pub(crate) fn id(&self) -> ServerId {
        self.id
    }

    /// Offers `fd` under `nonce` until the returned guard drops (whether or not it was taken).
    pub(crate) fn offer(&self, nonce: Nonce, fd: OwnedFd) -> Offered {
        self.offered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(nonce, fd);
        Offered {
            nonce,
            offered: self.offered.clone(),
        }
    }
}

impl Drop for RingServer {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(file) = &self.file {
            // A killed rank leaves its file; the directory goes with the job's last pod on the node.
            let _ = std::fs::remove_file(file);
        }
    }
}

/// A segment's descriptor on offer; withdrawn when dropped.
pub(crate) struct Offered {
    nonce: Nonce,
    offered: Arc<Mutex<HashMap<Nonce, OwnedFd>>>,
}

impl Drop for Offered {
    fn drop(&mut self) {
        self.offered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.nonce);
    }
}

/// A listener on a name in `place` nobody holds yet.
fn bind_fresh(place: &RingPlace) -> io::Result<(ServerId, UnixListener)> {
    let mut last = None;
    for _ in 0..8 {
        let mut id = [0u8; 16];
        getrandom::fill(&mut id).map_err(io::Error::other)?;
        match UnixListener::bind(address(place, &id)) {
            Ok(listener) => return Ok((id, listener)),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free socket name")))
}

async fn serve(listener: UnixListener, offered: Arc<Mutex<HashMap<Nonce, OwnedFd>>>) {
    let askers = Arc::new(Semaphore::new(MAX_ASKERS));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors, typically: give closing ones a moment.
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let Ok(permit) = askers.clone().try_acquire_owned() else {
            continue;
        };
        let offered = offered.clone();
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(error) = answer(stream, &offered).await {
                tracing::debug!(error = %rdu_error_chain::Chain(&error), "ring descriptor request refused");
            }
        });
    }
}

/// Reads one asker's nonce and sends the descriptor offered under it (one byte, 1, with the
/// descriptor), or one byte 0 with none. Each descriptor is handed out once.
async fn answer(
    mut stream: UnixStream,
    offered: &Mutex<HashMap<Nonce, OwnedFd>>,
) -> io::Result<()> {
    let me = rustix::process::geteuid().as_raw();
    let asker = stream.peer_cred()?.uid();
    if asker != me {
        return Err(io::Error::other(format!("asked by user {asker}")));
    }
    let mut nonce = [0u8; 16];
    tokio::time::timeout(ASK_TIMEOUT, stream.read_exact(&mut nonce))
        .await
        .map_err(|_| io::Error::other("no nonce in time"))??;
    let fd = offered
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&nonce);
    let Some(fd) = fd else {
        stream.write_all(&[0]).await?;
        return Ok(());
    };
    let fds = [fd.as_fd()];
    stream
        .async_io(Interest::WRITABLE, || {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            control.push(SendAncillaryMessage::ScmRights(&fds));
            rustix::net::sendmsg(
                &stream,
                &[IoSlice::new(&[1])],
                &mut control,
                SendFlags::empty(),
            )
            .map_err(io::Error::from)
        })
        .await?;
    Ok(())
}

/// Asks server `id`, whose socket is in `place`, for the descriptor offered under `nonce`.
pub(crate) async fn fetch(
    place: &RingPlace,
    id: &ServerId,
    nonce: &Nonce,
) -> Result<OwnedFd, PassError> {
    let mut stream = UnixStream::connect(address(place, id))
        .await
        .map_err(PassError::Connect)?;
    let me = rustix::process::geteuid().as_raw();
    let server = stream.peer_cred().map_err(PassError::Io)?.uid();
    if server != me {
        return Err(PassError::OtherUser(server));
    }
    stream.write_all(nonce).await.map_err(PassError::Io)?;
    loop {
        stream.readable().await.map_err(PassError::Io)?;
        let mut byte = [0u8; 1];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let received = stream.try_io(Interest::READABLE, || {
            rustix::net::recvmsg(
                &stream,
                &mut [IoSliceMut::new(&mut byte)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            )
            .map_err(io::Error::from)
        });
        let msg = match received {
            Ok(msg) => msg,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(PassError::Io(e)),
        };
        let mut fds: Vec<OwnedFd> = control
            .drain()
            .filter_map(|message| match message {
                RecvAncillaryMessage::ScmRights(fds) => Some(fds),
                _ => None,
            })
            .flatten()
            .collect();
        return match (msg.bytes, byte[0], fds.len()) {
            (1, 1, 1) => Ok(fds.remove(0)),
            (1, 0, 0) => Err(PassError::Unknown),
            (0, _, _) => Err(PassError::Io(io::ErrorKind::UnexpectedEof.into())),
            (_, _, n) => Err(PassError::Descriptors(n)),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::shm::segment::Segment;

    #[tokio::test]
    async fn an_offered_descriptor_is_handed_out_once_under_its_nonce() {
        let server = RingServer::start(&RingPlace::Abstract).unwrap();
        let made = Segment::create(4096, None).unwrap();
        let _offered = server.offer(made.nonce, made.fd);
        let mut wrong = made.nonce;
        wrong[15] ^= 1;
        assert!(matches!(
            fetch(&RingPlace::Abstract, &server.id(), &wrong).await,
            Err(PassError::Unknown)
        ));
        let fd = fetch(&RingPlace::Abstract, &server.id(), &made.nonce)
            .await
            .unwrap();
        let attached = Segment::attach(fd, &made.nonce).unwrap();
        assert_eq!(attached.capacity(), 4096);
        assert!(matches!(
            fetch(&RingPlace::Abstract, &server.id(), &made.nonce).await,
            Err(PassError::Unknown)
        ));
    }

    #[tokio::test]
    async fn a_withdrawn_offer_or_a_server_that_is_gone_gives_nothing() {
        let server = RingServer::start(&RingPlace::Abstract).unwrap();
        let made = Segment::create(4096, None).unwrap();
        drop(server.offer(made.nonce, made.fd));
        assert!(matches!(
            fetch(&RingPlace::Abstract, &server.id(), &made.nonce).await,
            Err(PassError::Unknown)
        ));
        let id = server.id();
        drop(server);
        // The listener goes with the task; wait until the name is free (bounded).
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            match fetch(&RingPlace::Abstract, &id, &made.nonce).await {
                Err(PassError::Connect(_)) => break,
                _ if std::time::Instant::now() < deadline => tokio::task::yield_now().await,
                other => panic!("the server's socket outlived it: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_socket_in_a_directory_is_reached_there_alone_and_removed_with_its_server() {
        let dir = tempfile::tempdir().unwrap();
        let place = RingPlace::Dir(dir.path().to_path_buf());
        let server = RingServer::start(&place).unwrap();
        let made = Segment::create(4096, None).unwrap();
        let _offered = server.offer(made.nonce, made.fd);
        let file = address(&place, &server.id());
        assert!(file.starts_with(dir.path()) && file.exists(), "{file:?}");
        // A rank that does not see the directory (here: looks in the abstract namespace) cannot.
        assert!(matches!(
            fetch(&RingPlace::Abstract, &server.id(), &made.nonce).await,
            Err(PassError::Connect(_))
        ));
        let other = tempfile::tempdir().unwrap();
        assert!(matches!(
            fetch(
                &RingPlace::Dir(other.path().to_path_buf()),
                &server.id(),
                &made.nonce
            )
            .await,
            Err(PassError::Connect(_))
        ));
        let fd = fetch(&place, &server.id(), &made.nonce).await.unwrap();
        assert_eq!(Segment::attach(fd, &made.nonce).unwrap().capacity(), 4096);
        drop(server);
        assert!(!file.exists(), "the socket file outlived its server");
    }

    #[test]
    fn the_longest_directory_leaves_room_for_the_socket_name() {
        let dir = PathBuf::from(format!(
            "/{}",
            "d".repeat(crate::config::MAX_RING_DIR_BYTES - 1)
        ));
        let path = address(&RingPlace::Dir(dir), &[0xab; 16]);
        assert_eq!(path.as_os_str().len(), 107);
    }

    #[tokio::test]
    async fn a_received_segment_cannot_be_truncated_by_its_receiver_either() {
        let server = RingServer::start(&RingPlace::Abstract).unwrap();
        let made = Segment::create(4096, None).unwrap();
        let _offered = server.offer(made.nonce, made.fd);
        let fd = fetch(&RingPlace::Abstract, &server.id(), &made.nonce)
            .await
            .unwrap();
        assert_eq!(rustix::fs::ftruncate(&fd, 0), Err(rustix::io::Errno::PERM));
        let attached = Segment::attach(fd, &made.nonce).unwrap();
        attached
            .head()
            .store(8, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            made.segment
                .head()
                .load(std::sync::atomic::Ordering::SeqCst),
            8
        );
    }
}
