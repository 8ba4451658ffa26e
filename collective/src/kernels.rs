//! The arithmetic of a collective: f32 <-> little-endian bytes, elementwise add and copy.
//! Plain loops over fixed-size arrays so the compiler vectorizes them; no per-element allocation.

use bytes::Bytes;

/// Copies `src` into a new little-endian byte buffer (the one copy on the send path).
pub(crate) fn encode(src: &[f32]) -> Bytes {
    let mut out = vec![0u8; src.len() * 4];
    let (words, _) = out.as_chunks_mut::<4>();
    for (w, v) in words.iter_mut().zip(src) {
        *w = v.to_le_bytes();
    }
    Bytes::from(out)
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
        let v = [1.5f32, -0.0, f32::MAX, f32::MIN_POSITIVE, 3.25];
        let bytes = encode(&v);
        assert_eq!(bytes.len(), 20);
        let mut back = [0f32; 5];
        copy_from_le(&mut back, &bytes);
        assert_eq!(v.map(f32::to_bits), back.map(f32::to_bits));
    }

    #[test]
    fn add_adds_elementwise() {
        let mut acc = [1.0f32, 2.0, 3.0];
        add_from_le(&mut acc, &encode(&[10.0, 20.0, 30.0]));
        assert_eq!(acc, [11.0, 22.0, 33.0]);
    }
}
