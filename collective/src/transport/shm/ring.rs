//! A single-producer single-consumer byte ring in a shared segment, carrying the frames of one
//! directed pair of ranks (header, then payload, padded to 8 bytes) instead of the TCP stream.
//! The sender copies each frame in once and the receiver reduces straight out of the ring, where
//! TCP costs a copy into the kernel, a copy out of it and a system call per piece.
//!
//! The sender publishes `head` after each piece and the receiver `tail`; both only grow, are
//! multiples of 8, and are checked against the capacity whenever read, since the other process
//! may write anything there. The sender writes a small frame, header and all, with one publish.
//! An end that finds nothing to do polls for `spin` (yielding its core and its task between
//! polls; a receive whose task has nothing else to do polls in place, yielding only the core
//! now and then), then sets its `parked` flag, looks once more, and sleeps on the data stream's
//! socket until the other end rings (see `bell`). Each end rings after it published
//! only if the other end's flag is set, so neither wake-up is lost (both flag and counter are
//! sequentially consistent) and a busy ring makes no system calls.

use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::time::{Duration, Instant};

use super::bell::{Bell, Wake};
use super::segment::Segment;
use crate::kernels::Apply;
use crate::transport::frame::{ChunkId, HEADER_LEN, InboxError, ReceiveMode, check_header, ended};

/// Bytes copied in or reduced out before the counter moves: the other end starts on a frame
/// while the rest of it is still being copied.
pub(crate) const PIECE_BYTES: usize = 128 << 10;
/// Frames start at multiples of this, so a value never straddles the ring's end.
const ALIGN: usize = 8;

/// Why the sending end failed.
#[derive(Debug)]
pub(crate) enum WriteError {
    /// The receiver went away.
    Lost(String),
    /// The receiver's counter is impossible.
    Violation(String),
}

/// How a waiting end polls before it parks (how long comes from the crate's `spin::Spin`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Polling {
    /// Park at once.
    Off,
    /// Poll for this long, handing the core and the task back between polls: other futures of
    /// the task (the sending half of an exchange) and other threads on the core run.
    Yielding(Duration),
    /// Poll for this long without returning to the runtime (nothing else of the task waits),
    /// handing the core to other threads every `POLLS_PER_YIELD` polls.
    InPlace(Duration),
}

/// Polls in place between two `sched_yield`s: with the other end on another core a small frame
/// lands within a few polls and no system call is made; with both ends on one core the other
/// gets it after a few microseconds at most.
const POLLS_PER_YIELD: u32 = 64;

/// Polls `check` until it gives a value, as `polling` says, and then asleep on `bell` with
/// `parked` set.
async fn wait_until<T, E>(
    bell: &impl Bell,
    parked: &std::sync::atomic::AtomicU32,
    polling: Polling,
    mut check: impl FnMut() -> Result<Option<T>, E>,
    mut on_wake: impl FnMut(Result<Wake, String>) -> Result<(), E>,
) -> Result<T, E> {
    let mut yielding_until = match polling {
        Polling::Off => None,
        Polling::Yielding(d) => Some(Instant::now() + d),
        Polling::InPlace(d) => {
            if let Some(found) = poll_in_place(d, &mut check)? {
                return Ok(found);
            }
            None
        }
    };
    loop {
        if let Some(found) = check()? {
            return Ok(found);
        }
        if let Some(until) = yielding_until {
            if Instant::now() < until {
                // Hand the core to another runnable thread (a peer rank sharing it), then
                // this thread to the other half of the exchange (this rank's own send).
                std::thread::yield_now();
                YieldToSiblings(false).await;
                continue;
            }
            yielding_until = None;
        }
        parked.store(1, SeqCst);
        if let Some(found) = check()? {
            parked.store(0, Relaxed);
            return Ok(found);
        }
        on_wake(bell.wait().await)?;
    }
}

/// Polls `check` in place for up to `spin`, yielding the core every `POLLS_PER_YIELD` polls.
fn poll_in_place<T, E>(
    spin: Duration,
    check: &mut impl FnMut() -> Result<Option<T>, E>,
) -> Result<Option<T>, E> {
    let until = Instant::now() + spin;
    loop {
        for _ in 0..POLLS_PER_YIELD {
            if let Some(found) = check()? {
                return Ok(Some(found));
            }
            std::hint::spin_loop();
        }
        if Instant::now() >= until {
            return Ok(None);
        }
        std::thread::yield_now();
    }
}

/// Lets the other futures of this task run (the sending half of an exchange, joined with the
/// receiving half), then is ready: the task is woken at once and polled again, without waiting
/// for the runtime to poll its I/O driver first as tokio's `yield_now` does.
struct YieldToSiblings(bool);

impl std::future::Future for YieldToSiblings {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

/// The sending end of a ring.
pub(crate) struct RingWriter {
    segment: Segment,
    head: u64,
    spin: Option<Duration>,
    /// How often the head was published (each a cache line the reader's core fetches).
    publishes: u64,
}

impl RingWriter {
    pub(crate) fn new(segment: Segment, spin: Option<Duration>) -> Self {
        RingWriter {
            segment,
            head: 0,
            spin,
            publishes: 0,
        }
    }

    /// Writes one frame, `header` then `payload` (a whole number of values) padded with zeros
    /// to a multiple of 8, as space frees; returns once all of it is in the ring.
    pub(crate) async fn write_frame(
        &mut self,
        bell: &impl Bell,
        header: &[u8; HEADER_LEN],
        payload: &[u8],
    ) -> Result<(), WriteError> {
        let whole = payload.len() / ALIGN * ALIGN;
        let rest = &payload[whole..];
        let mut last = [0u8; ALIGN];
        last[..rest.len()].copy_from_slice(rest);
        let padded: &[u8] = if rest.is_empty() { &[] } else { &last };
        self.put(bell, [header.as_slice(), &payload[..whole], padded])
            .await
    }

    /// Copies `parts` (each a multiple of 8) in, publishing the head once per piece and at the
    /// end: a small frame, header and all, reaches the reader with one publish, so it wakes to a
    /// whole frame and the counter's cache line crosses cores once.
    async fn put(&mut self, bell: &impl Bell, parts: [&[u8]; 3]) -> Result<(), WriteError> {
        let capacity = self.segment.capacity();
        let mut unpublished = 0;
        for mut bytes in parts {
            debug_assert!(bytes.len().is_multiple_of(ALIGN));
            while !bytes.is_empty() {
                let free = match self.free()? {
                    free if free >= ALIGN => free,
                    _ => {
                        // The reader waits for what is copied in already: publish it first.
                        self.publish(bell);
                        unpublished = 0;
                        self.wait_for_space(bell).await?
                    }
                };
                let at = (self.head % capacity as u64) as usize;
                let n = bytes
                    .len()
                    .min(free)
                    .min(capacity - at)
                    .min(PIECE_BYTES - unpublished);
                // SAFETY: `at + n <= capacity`, and the receiver does not read these bytes until
                // `head` (published below) covers them: they are free space (`free` checked it).
                unsafe {
                    self.segment
                        .ring()
                        .add(at)
                        .copy_from_nonoverlapping(bytes.as_ptr(), n)
                };
                bytes = &bytes[n..];
                self.head += n as u64;
                unpublished += n;
                if unpublished == PIECE_BYTES {
                    self.publish(bell);
                    unpublished = 0;
                }
            }
        }
        self.publish(bell);
        Ok(())
    }

    /// Publishes the head, waking the reader if it sleeps.
    fn publish(&mut self, bell: &impl Bell) {
        self.publishes += 1;
        self.segment.head().store(self.head, SeqCst);
        let reader = self.segment.reader_parked();
        if reader.load(SeqCst) != 0 && reader.swap(0, SeqCst) != 0 {
            bell.ring();
        }
    }

    /// Free bytes (at least 8), once there are.
    async fn wait_for_space(&self, bell: &impl Bell) -> Result<usize, WriteError> {
        wait_until(
            bell,
            self.segment.writer_parked(),
            self.spin.map_or(Polling::Off, Polling::Yielding),
            || self.free().map(|free| (free >= ALIGN).then_some(free)),
            |wake| match wake {
                Ok(Wake::Rung) => Ok(()),
                Ok(Wake::Closed) => Err(WriteError::Lost("it closed its data stream".into())),
                Err(e) => Err(WriteError::Lost(format!(
                    "waiting for its ring to drain: {e}"
                ))),
            },
        )
        .await
    }

    fn free(&self) -> Result<usize, WriteError> {
        let capacity = self.segment.capacity();
        let tail = self.segment.tail().load(SeqCst);
        let used = self.head.wrapping_sub(tail);
        if !tail.is_multiple_of(ALIGN as u64) || used > capacity as u64 {
            return Err(WriteError::Violation(format!(
                "its shared ring's tail {tail} is out of range (head {}, capacity {capacity})",
                self.head
            )));
        }
        Ok(capacity - used as usize)
    }
}

/// The receiving end of a ring.
pub(crate) struct RingReader {
    segment: Segment,
    tail: u64,
    /// How often the tail was published.
    publishes: u64,
}

impl RingReader {
    pub(crate) fn new(segment: Segment) -> Self {
        RingReader {
            segment,
            tail: 0,
            publishes: 0,
        }
    }

    /// Takes the next frame, which must be `expected` with `dst.len()` values, and applies it
    /// to `dst` straight from the ring.
    pub(crate) async fn receive(
        &mut self,
        bell: &impl Bell,
        expected: ChunkId,
        dst: &mut [f32],
        apply: Apply,
        mode: ReceiveMode,
    ) -> Result<(), InboxError> {
        let width = mode.compression.bytes_per_value();
        let payload = dst.len() * width;
        self.wait_for(bell, HEADER_LEN, mode, true).await?;
        check_header(&self.header(), expected, payload)?;
        // The header's bytes are freed with the first piece (or the padding): one publish.
        self.tail += HEADER_LEN as u64;
        let capacity = self.segment.capacity();
        let mut done = 0;
        while done < payload {
            let available = self.wait_for(bell, 1, mode, false).await?;
            let at = (self.tail % capacity as u64) as usize;
            // A multiple of the value width: `available`, `capacity - at` and PIECE_BYTES
            // are multiples of 8 (counters are, and frames start at them), `payload - done` of
            // the width.
            let n = available
                .min(payload - done)
                .min(capacity - at)
                .min(PIECE_BYTES);
            // SAFETY: `at + n <= capacity`, and the sender published these bytes (`head`
            // covers them) and will not touch them until `tail` moves past them.
            let bytes = unsafe { std::slice::from_raw_parts(self.segment.ring().add(at), n) };
            mode.compression
                .decode_apply(&mut dst[done / width..(done + n) / width], bytes, apply);
            done += n;
            self.tail += n as u64;
            if done < payload {
                self.publish(bell);
            }
        }
        // The padding: published with the frame's last bytes (the head is a multiple of 8).
        self.tail = self.tail.next_multiple_of(ALIGN as u64);
        self.publish(bell);
        Ok(())
    }

    /// The header at the tail, which may wrap around the ring's end.
    fn header(&self) -> [u8; HEADER_LEN] {
        let capacity = self.segment.capacity();
        let at = (self.tail % capacity as u64) as usize;
        let mut header = [0u8; HEADER_LEN];
        let first = HEADER_LEN.min(capacity - at);
        // SAFETY: both ranges are inside the ring, and published (`wait_for` checked).
        unsafe {
            let ring = self.segment.ring();
            header[..first].copy_from_slice(std::slice::from_raw_parts(ring.add(at), first));
            header[first..].copy_from_slice(std::slice::from_raw_parts(ring, HEADER_LEN - first));
        }
        header
    }

    /// Publishes the tail (a multiple of 8), waking the sender if it sleeps waiting for space.
    fn publish(&mut self, bell: &impl Bell) {
        self.publishes += 1;
        self.segment
            .tail()
            .store(self.tail / ALIGN as u64 * ALIGN as u64, SeqCst);
        let writer = self.segment.writer_parked();
        if writer.load(SeqCst) != 0 && writer.swap(0, SeqCst) != 0 {
            bell.ring();
        }
    }

    /// Published bytes not yet taken (at least `need`), once there are.
    async fn wait_for(
        &self,
        bell: &impl Bell,
        need: usize,
        mode: ReceiveMode,
        frame_start: bool,
    ) -> Result<usize, InboxError> {
        let polling = match mode.spin {
            Some(spin) if mode.in_place => Polling::InPlace(spin),
            Some(spin) => Polling::Yielding(spin),
            None => Polling::Off,
        };
        wait_until(
            bell,
            self.segment.reader_parked(),
            polling,
            || self.available().map(|n| (n >= need).then_some(n)),
            |wake| match wake {
                Ok(Wake::Rung) => Ok(()),
                Ok(Wake::Closed) => match self.available()? {
                    // What it published before closing is still there: take it.
                    n if n >= need => Ok(()),
                    0 if frame_start => Err(ended()),
                    _ => Err(InboxError::Lost("its stream ended inside a chunk".into())),
                },
                Err(e) => Err(InboxError::Lost(format!("reading its stream: {e}"))),
            },
        )
        .await
    }

    fn available(&self) -> Result<usize, InboxError> {
        let capacity = self.segment.capacity();
        let head = self.segment.head().load(SeqCst);
        let available = head.wrapping_sub(self.tail);
        if !head.is_multiple_of(ALIGN as u64) || available > capacity as u64 {
            return Err(InboxError::Violation(format!(
                "its shared ring's head {head} is out of range (tail {}, capacity {capacity})",
                self.tail
            )));
        }
        Ok(available as usize)
    }
}

#[cfg(test)]
mod tests {
    use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::compression::Compression;
    use crate::transport::frame::ChunkHeader;
    use crate::transport::shm::bell::LinkBell;

    const RING: usize = 4096;

    /// The sending end of a small ring and its side of the TCP stream.
    struct SendEnd {
        writer: RingWriter,
        link: (OwnedReadHalf, OwnedWriteHalf),
    }

    impl SendEnd {
        /// Writes `payload` as the frame of chunk `chunk`.
        async fn frame(&mut self, chunk: u32, payload: &[u8]) -> Result<(), WriteError> {
            let bell = LinkBell {
                read: &self.link.0,
                write: &self.link.1,
            };
            let header = ChunkHeader::of(id(chunk), payload.len()).unwrap().encode();
            self.writer.write_frame(&bell, &header, payload).await
        }

        /// Writes the bytes of part of a frame.
        async fn put(&mut self, bytes: &[u8]) {
            let bell = LinkBell {
                read: &self.link.0,
                write: &self.link.1,
            };
            self.writer.put(&bell, [bytes, &[], &[]]).await.unwrap();
        }
    }

    /// The receiving end of the ring and its side of the TCP stream.
    struct ReceiveEnd {
        reader: RingReader,
        inbox: TcpStream,
    }

    impl ReceiveEnd {
        /// Takes chunk `chunk` into `dst`.
        async fn take(
            &mut self,
            chunk: u32,
            dst: &mut [f32],
            apply: Apply,
            compression: Compression,
            spin: Option<Duration>,
        ) -> Result<(), InboxError> {
            let mode = ReceiveMode {
                compression,
                spin,
                in_place: false,
            };
            self.reader
                .receive(&self.inbox, id(chunk), dst, apply, mode)
                .await
        }

        /// Takes chunk `chunk` of f32 values added onto `dst`, parking at once.
        async fn add(&mut self, chunk: u32, dst: &mut [f32]) -> Result<(), InboxError> {
            self.take(chunk, dst, Apply::Add, Compression::None, None)
                .await
        }
    }

    /// Both ends of one small ring.
    struct Pair {
        send: SendEnd,
        receive: ReceiveEnd,
        /// A third mapping of the segment, to watch it.
        observer: Segment,
    }

    async fn pair(spin: Option<Duration>) -> Pair {
        let made = Segment::create(RING, None).unwrap();
        let attach = || Segment::attach(made.fd.try_clone().unwrap(), &made.nonce).unwrap();
        let (attached, observer) = (attach(), attach());
        let segment = made.segment;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let link = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (inbox, _) = listener.accept().await.unwrap();
        Pair {
            send: SendEnd {
                writer: RingWriter::new(segment, spin),
                link: link.into_split(),
            },
            receive: ReceiveEnd {
                reader: RingReader::new(attached),
                inbox,
            },
            observer,
        }
    }

    fn id(chunk: u32) -> ChunkId {
        ChunkId {
            op_id: 2,
            phase: 16,
            segment: 0,
            chunk,
        }
    }

    #[tokio::test]
    async fn a_small_frame_crosses_with_one_publish_each_way() {
        let Pair {
            mut send,
            mut receive,
            observer,
        } = pair(None).await;
        let values = [1.5f32; 10];
        send.frame(0, &crate::kernels::le_bytes(&values))
            .await
            .unwrap();
        assert_eq!(send.writer.publishes, 1, "header and payload together");
        assert_eq!(observer.head().load(SeqCst), (HEADER_LEN + 40) as u64);
        let mut got = vec![0.0f32; 10];
        receive.add(0, &mut got).await.unwrap();
        assert_eq!(got, values);
        assert_eq!(
            receive.reader.publishes, 1,
            "header, payload and padding freed together"
        );
        assert_eq!(observer.tail().load(SeqCst), (HEADER_LEN + 40) as u64);
    }

    /// A bell no wait may ring on: the waits below must not park.
    struct NeverParks;

    impl Bell for NeverParks {
        fn ring(&self) {}

        async fn wait(&self) -> Result<Wake, String> {
            panic!("parked")
        }
    }

    /// Waits, as `polling` says, for the 1,000th poll, while a task spawned on the same
    /// current-thread runtime waits to run; says whether it ran before the wait ended.
    fn sibling_ran_during_a_wait(polling: Polling) -> bool {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let flag = ran.clone();
            let sibling = tokio::spawn(async move { flag.store(true, SeqCst) });
            let parked = std::sync::atomic::AtomicU32::new(0);
            let mut polls = 0;
            let check = || {
                polls += 1;
                Ok::<_, ()>((polls == 1000).then_some(polls))
            };
            let found = wait_until(&NeverParks, &parked, polling, check, |_| Ok(())).await;
            assert_eq!(found, Ok(1000));
            let ran_during = ran.load(SeqCst);
            sibling.await.unwrap();
            ran_during
        })
    }

    #[test]
    fn an_in_place_wait_keeps_the_thread_and_a_yielding_one_lets_the_runtime_run() {
        let long = Duration::from_secs(60);
        assert!(!sibling_ran_during_a_wait(Polling::InPlace(long)));
        assert!(sibling_ran_during_a_wait(Polling::Yielding(long)));
    }

    #[tokio::test]
    async fn an_in_place_wait_parks_once_its_spin_is_over() {
        let parked = std::sync::atomic::AtomicU32::new(0);
        let started = Instant::now();
        let spin = Duration::from_millis(2);
        let ended = wait_until(
            &ClosesAtOnce,
            &parked,
            Polling::InPlace(spin),
            || Ok::<Option<()>, &str>(None),
            |wake| match wake {
                Ok(Wake::Closed) => Err("closed"),
                _ => Ok(()),
            },
        )
        .await;
        assert_eq!(ended, Err("closed"));
        assert_eq!(parked.load(SeqCst), 1, "it set its flag before sleeping");
        assert!(started.elapsed() >= spin, "it polled for its spin first");
    }

    /// A bell whose other end is gone.
    struct ClosesAtOnce;

    impl Bell for ClosesAtOnce {
        fn ring(&self) {}

        async fn wait(&self) -> Result<Wake, String> {
            Ok(Wake::Closed)
        }
    }

    #[tokio::test]
    async fn frames_of_every_length_cross_a_ring_smaller_than_them_parked_or_polling() {
        for spin in [None, Some(Duration::from_micros(200))] {
            let Pair {
                mut send,
                mut receive,
                ..
            } = pair(spin).await;
            // Lengths that leave 0 or 4 bytes of padding, and frames many times the ring.
            let lengths = [0usize, 1, 2, 3, 1023, 1024, 5000, 20_001];
            let sender = async {
                for (k, &len) in lengths.iter().enumerate() {
                    let values: Vec<f32> = (0..len).map(|i| i as f32 - k as f32).collect();
                    let bytes = crate::kernels::le_bytes(&values);
                    send.frame(k as u32, &bytes).await.unwrap();
                }
            };
            let receiver = async {
                for (k, &len) in lengths.iter().enumerate() {
                    let mut got = vec![0.5f32; len];
                    receive
                        .take(k as u32, &mut got, Apply::Add, Compression::None, spin)
                        .await
                        .unwrap();
                    let want: Vec<f32> = (0..len).map(|i| i as f32 - k as f32 + 0.5).collect();
                    assert_eq!(got, want, "frame {k} of {len} values, spin {spin:?}");
                }
            };
            tokio::join!(sender, receiver);
        }
    }

    #[tokio::test]
    async fn sixteen_bit_values_of_odd_counts_are_copied_out() {
        let mut p = pair(None).await;
        for (k, len) in [1usize, 3, 5, 3001].into_iter().enumerate() {
            let mut values: Vec<f32> = (0..len).map(|i| (i % 50) as f32 * 0.25).collect();
            let mut encoded = Vec::new();
            Compression::Bf16.round_and_encode(&mut values, &mut encoded);
            let mut got = vec![9.0f32; len];
            let (sent, taken) = tokio::join!(
                p.send.frame(k as u32, &encoded),
                p.receive
                    .take(k as u32, &mut got, Apply::Copy, Compression::Bf16, None)
            );
            sent.unwrap();
            taken.unwrap();
            assert_eq!(got, values, "{len} values");
        }
    }

    #[tokio::test]
    async fn a_reader_that_goes_away_fails_a_writer_waiting_for_space() {
        let Pair {
            mut send,
            receive,
            observer,
        } = pair(None).await;
        let payload = vec![0u8; RING * 3];
        let closing = async {
            // Once the writer fills the ring and sleeps, the receiving side closes.
            while observer.writer_parked().load(SeqCst) == 0 {
                tokio::task::yield_now().await;
            }
            drop(receive);
        };
        let (written, ()) = tokio::join!(send.frame(0, &payload), closing);
        assert!(
            matches!(written, Err(WriteError::Lost(ref r)) if r.contains("closed")),
            "{written:?}"
        );
    }

    #[tokio::test]
    async fn a_writer_that_goes_away_mid_frame_is_lost_and_at_a_frame_boundary_ended() {
        let Pair {
            mut send,
            mut receive,
            ..
        } = pair(None).await;
        // A whole frame, then the first bytes of the next (header and 16 of its 64 bytes).
        send.frame(0, &[0u8; 64]).await.unwrap();
        let mut next = ChunkHeader::of(id(1), 64).unwrap().encode().to_vec();
        next.extend_from_slice(&[0u8; 16]);
        send.put(&next).await;
        drop(send);
        let mut got = [0f32; 16];
        let first = receive.add(0, &mut got).await;
        assert!(
            first.is_ok(),
            "what was published before the close is taken: {first:?}"
        );
        let torn = receive.add(1, &mut got).await;
        assert!(
            matches!(torn, Err(InboxError::Lost(ref r)) if r.contains("inside a chunk")),
            "{torn:?}"
        );

        let Pair {
            send, mut receive, ..
        } = pair(None).await;
        drop(send);
        let ended_cleanly = receive.add(0, &mut got).await;
        assert!(
            matches!(ended_cleanly, Err(InboxError::Lost(ref r)) if r.contains("stream to this rank ended")),
            "{ended_cleanly:?}"
        );
    }

    #[tokio::test]
    async fn impossible_counters_from_the_other_process_are_violations() {
        let mut p = pair(None).await;
        let mut got = [0f32; 4];
        for head in [RING as u64 + 8, 12] {
            p.observer.head().store(head, SeqCst);
            let error = p.receive.add(0, &mut got).await;
            assert!(
                matches!(error, Err(InboxError::Violation(ref r)) if r.contains("head")),
                "head {head}: {error:?}"
            );
        }
        p.observer.tail().store(64, SeqCst);
        let error = p.send.frame(0, &[]).await;
        assert!(
            matches!(error, Err(WriteError::Violation(ref r)) if r.contains("tail")),
            "{error:?}"
        );
    }

    #[tokio::test]
    async fn an_unexpected_frame_is_refused_by_its_header() {
        let mut p = pair(None).await;
        p.send.frame(5, &[0u8; 8]).await.unwrap();
        let mut got = [0f32; 2];
        let error = p.receive.add(4, &mut got).await;
        assert!(
            matches!(error, Err(InboxError::Violation(ref r)) if r.contains("sequence of collectives")),
            "{error:?}"
        );
    }
}
