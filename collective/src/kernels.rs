//! The arithmetic of a collective: what a received chunk does to the values it lands on
//! ([`Apply`]), f32 <-> little-endian bytes, elementwise add and copy. Plain loops over fixed-size arrays so the compiler vectorizes them; no per-element
//! allocation, and send buffers are recycled through a small pool so the hot path neither
//! calls the allocator for fresh pages nor zero-fills.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// What a received chunk does to the values it lands on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Apply {
    /// `dst[i] += received[i]` (reduce).
    Add,
    /// `dst[i] = received[i]` (gather, broadcast).
    Copy,
}

/// Recycles the byte buffers chunks are encoded into; a buffer returns when the transport
/// drops the last reference to its `Bytes`.
pub(crate) struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
    keep: usize,
}

impl BufferPool {
    /// A pool keeping at most `keep` idle buffers.
    pub(crate) fn new(keep: usize) -> Arc<Self> {
        Arc::new(BufferPool {
            free: Mutex::new(Vec::new()),
            keep,
        })
    }

    /// Copies `src` as little-endian bytes into a pooled buffer (the one copy on the send path).
    pub(crate) fn encode(self: &Arc<Self>, src: &[f32]) -> Bytes {
        let mut out = self.take(src.len() * 4);
        for block in src.chunks(256) {
            let mut words = [[0u8; 4]; 256];
            for (w, v) in words.iter_mut().zip(block) {
                *w = v.to_le_bytes();
            }
            out.extend_from_slice(words[..block.len()].as_flattened());
        }
        self.wrap(out)
    }

    /// An empty buffer with room for `capacity` bytes, recycled when one is idle.
    pub(crate) fn take(&self, capacity: usize) -> Vec<u8> {
        let recycled = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut out = recycled.unwrap_or_default();
        out.clear();
        out.reserve(capacity);
        out
    }

    /// Shares `buf` as `Bytes`; it returns to the pool when the last reference drops.
    pub(crate) fn wrap(self: &Arc<Self>, buf: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled {
            buf,
            pool: Arc::clone(self),
        })
    }

    #[cfg(test)]
    fn idle(&self) -> usize {
        self.free.lock().map(|f| f.len()).unwrap_or_default()
    }
}

struct Pooled {
    buf: Vec<u8>,
    pool: Arc<BufferPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let mut free = self.pool.free.lock().unwrap_or_else(|p| p.into_inner());
        if free.len() < self.pool.keep {
            free.push(std::mem::take(&mut self.buf));
        }
    }
}

/// The little-endian bytes of `values`: borrowed as they are on little-endian machines (no
/// copy on the send path), encoded elsewhere.
pub(crate) fn le_bytes(values: &[f32]) -> Cow<'_, [u8]> {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: the byte slice covers exactly the memory of `values` (size_of_val), which
        // stays borrowed for the result's lifetime; u8 has alignment 1 and every byte of an
        // f32 is initialised (no padding), and on a little-endian machine the in-memory
        // bytes are the little-endian encoding.
        let bytes = unsafe {
            std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
        };
        Cow::Borrowed(bytes)
    }
    #[cfg(not(target_endian = "little"))]
    {
        Cow::Owned(values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }
}

/// The memory of `values` as bytes to receive into: on a little-endian machine these bytes
/// are the values' little-endian encoding, so a chunk read into them needs no further copy.
#[cfg(target_endian = "little")]
pub(crate) fn le_bytes_mut(values: &mut [f32]) -> &mut [u8] {
    // SAFETY: the byte slice covers exactly the memory of `values` (size_of_val), which stays
    // mutably borrowed for the result's lifetime; u8 has alignment 1, and every byte pattern
    // written through it forms a valid f32 (f32 has no invalid bit patterns).
    unsafe {
        std::slice::from_raw_parts_mut(
            values.as_mut_ptr().cast::<u8>(),
            std::mem::size_of_val(values),
        )
    }
}

/// `dst[i] += src[i]`; `src` must hold exactly `dst.len() * 4` bytes (checked by the caller).
pub(crate) fn add_from_le(dst: &mut [f32], src: &[u8]) {
    let (words, _) = src.as_chunks::<4>();
    for (d, w) in dst.iter_mut().zip(words) {
        *d += f32::from_le_bytes(*w);
    }
}

/// `dst[i] = src[i]`; `src` must hold exactly `dst.len() * 4` bytes (checked by the caller).
pub(crate) fn copy_from_le(dst: &mut [f32], src: &[u8]) {
    let (words, _) = src.as_chunks::<4>();
    for (d, w) in dst.iter_mut().zip(words) {
        *d = f32::from_le_bytes(*w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_then_copy_round_trips_bits() {
        let pool = BufferPool::new(4);
        let v: Vec<f32> = [1.5f32, -0.0, f32::MAX, f32::MIN_POSITIVE, 3.25]
            .into_iter()
            .cycle()
            .take(1001)
            .collect();
        let bytes = pool.encode(&v);
        assert_eq!(bytes.len(), v.len() * 4);
        let mut back = vec![0f32; v.len()];
        copy_from_le(&mut back, &bytes);
        assert!(v.iter().zip(&back).all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    #[test]
    fn buffers_return_to_the_pool_up_to_its_limit() {
        let pool = BufferPool::new(1);
        let a = pool.encode(&[1.0; 10]);
        let b = pool.encode(&[2.0; 10]);
        drop(a);
        drop(b);
        assert_eq!(pool.idle(), 1);
        let c = pool.encode(&[3.0; 3]);
        assert_eq!(pool.idle(), 0);
        assert_eq!(c.len(), 12);
        let mut back = [0f32; 3];
        copy_from_le(&mut back, &c);
        assert_eq!(back, [3.0; 3]);
    }

    #[test]
    fn le_bytes_are_the_encoded_bytes() {
        let v = [1.5f32, -0.0, f32::MAX, f32::MIN_POSITIVE, f32::NAN];
        let expected: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(&*le_bytes(&v), &expected[..]);
        assert!(le_bytes(&[]).is_empty());
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn bytes_written_through_le_bytes_mut_are_decoded_as_values() {
        let v = [1.5f32, -0.0, f32::MAX, f32::MIN_POSITIVE];
        let encoded: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut back = [0f32; 4];
        le_bytes_mut(&mut back).copy_from_slice(&encoded);
        assert!(v.iter().zip(&back).all(|(a, b)| a.to_bits() == b.to_bits()));
        assert!(le_bytes_mut(&mut []).is_empty());
    }

    #[test]
    fn add_adds_elementwise() {
        let pool = BufferPool::new(1);
        let mut acc = [1.0f32, 2.0, 3.0];
        add_from_le(&mut acc, &pool.encode(&[10.0, 20.0, 30.0]));
        assert_eq!(acc, [11.0, 22.0, 33.0]);
    }
}
