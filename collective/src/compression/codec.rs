//! The 16-bit codecs in portable Rust: what every CPU runs, and (compiled again with AVX2 enabled)
//! the bfloat16 path on x86-64. Each loop is written without branches so it vectorizes.

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::kernels::Apply;

/// Values converted at a time through the stack: small enough to stay in L1.
const BLOCK: usize = 512;

/// `v` rounded to the nearest bfloat16 (ties to even; NaN stays a quiet NaN, overflow becomes
/// infinity), as its bits: the same results as `half::bf16::from_f32`, without branches.
#[inline(always)]
pub(super) fn bf16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
    let quiet_nan = (b >> 16) as u16 | 0x0040;
    if b & 0x7FFF_FFFF > 0x7F80_0000 {
        quiet_nan
    } else {
        rounded
    }
}

/// The f32 a bfloat16's bits stand for (exact: bf16 is f32's top half).
#[inline(always)]
fn bf16_value(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Rounds `values` to bfloat16 in place and writes their little-endian bits to `words`.
#[inline(always)]
pub(super) fn bf16_encode(words: &mut [[u8; 2]], values: &mut [f32]) {
    for (w, v) in words.iter_mut().zip(values.iter_mut()) {
        let bits = bf16_bits(*v);
        *w = bits.to_le_bytes();
        *v = bf16_value(bits);
    }
}

/// Adds (or copies) the bfloat16 `words` into `dst`.
#[inline(always)]
pub(super) fn bf16_decode(dst: &mut [f32], words: &[[u8; 2]], apply: Apply) {
    match apply {
        Apply::Add => {
            for (d, w) in dst.iter_mut().zip(words) {
                *d += bf16_value(u16::from_le_bytes(*w));
            }
        }
        Apply::Copy => {
            for (d, w) in dst.iter_mut().zip(words) {
                *d = bf16_value(u16::from_le_bytes(*w));
            }
        }
    }
}

/// Rounds `values` to IEEE half in place and writes their little-endian bits to `words`.
pub(super) fn fp16_encode(words: &mut [[u8; 2]], values: &mut [f32]) {
    for (words, block) in words.chunks_mut(BLOCK).zip(values.chunks_mut(BLOCK)) {
        let mut halves = [f16::ZERO; BLOCK];
        let halves = &mut halves[..block.len()];
        halves.convert_from_f32_slice(block);
        halves.convert_to_f32_slice(block);
        for (w, h) in words.iter_mut().zip(halves.iter()) {
            *w = h.to_bits().to_le_bytes();
        }
    }
}

/// Adds (or copies) the IEEE half `words` into `dst`.
pub(super) fn fp16_decode(dst: &mut [f32], words: &[[u8; 2]], apply: Apply) {
    for (block, words) in dst.chunks_mut(BLOCK).zip(words.chunks(BLOCK)) {
        let mut halves = [f16::ZERO; BLOCK];
        let halves = &mut halves[..block.len()];
        for (h, w) in halves.iter_mut().zip(words) {
            *h = f16::from_bits(u16::from_le_bytes(*w));
        }
        let mut decoded = [0f32; BLOCK];
        let decoded = &mut decoded[..block.len()];
        halves.convert_to_f32_slice(decoded);
        match apply {
            Apply::Add => block
                .iter_mut()
                .zip(decoded.iter())
                .for_each(|(v, d)| *v += d),
            Apply::Copy => block.copy_from_slice(decoded),
        }
    }
}
