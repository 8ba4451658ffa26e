//! The 16-bit codecs with x86-64's vector instructions, chosen at run time: AVX2 for bfloat16
//! (the portable loops compiled for 8 lanes) and F16C for IEEE half (8 conversions per
//! instruction, rounding to nearest even as the portable path does).

use std::arch::x86_64::{
    __m128i, __m256i, _MM_FROUND_TO_NEAREST_INT, _mm_loadu_si128, _mm_storeu_si128,
    _mm256_add_epi32, _mm256_add_ps, _mm256_and_si256, _mm256_blendv_epi8, _mm256_castsi256_si128,
    _mm256_cmpgt_epi32, _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_loadu_ps, _mm256_loadu_si256,
    _mm256_or_si256, _mm256_packus_epi32, _mm256_permute4x64_epi64, _mm256_set1_epi32,
    _mm256_srli_epi32, _mm256_storeu_ps, _mm256_storeu_si256,
};

use super::codec;
use crate::kernels::Apply;

/// Whether this CPU converts halves in hardware.
pub(super) fn has_f16c() -> bool {
    std::arch::is_x86_feature_detected!("avx") && std::arch::is_x86_feature_detected!("f16c")
}

/// [`codec::bf16_encode`] eight values at a time with AVX2 (the tail by the portable code).
#[target_feature(enable = "avx2")]
pub(super) fn bf16_encode(words: &mut [[u8; 2]], values: &mut [f32]) {
    let n = words.len().min(values.len());
    let (words, values) = (&mut words[..n], &mut values[..n]);
    let mut word_blocks = words.chunks_exact_mut(8);
    let mut value_blocks = values.chunks_exact_mut(8);
    for (w, v) in (&mut word_blocks).zip(&mut value_blocks) {
        bf16_encode_8(
            w.try_into().expect("8 words"),
            v.try_into().expect("8 values"),
        );
    }
    codec::bf16_encode(word_blocks.into_remainder(), value_blocks.into_remainder());
}

/// [`codec::bf16_bits`] on eight lanes: add 0x7FFF plus the lowest kept bit (ties to even),
/// except that a NaN keeps its bits with the quiet bit set; keep the top 16 bits.
#[target_feature(enable = "avx2")]
fn bf16_encode_8(words: &mut [[u8; 2]; 8], values: &mut [f32; 8]) {
    // SAFETY: both arrays are exactly one vector long; the loads and stores are unaligned ones.
    unsafe {
        let x = _mm256_loadu_si256(values.as_ptr().cast::<__m256i>());
        let lowest_kept = _mm256_and_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(1));
        let rounded = _mm256_add_epi32(x, _mm256_add_epi32(lowest_kept, _mm256_set1_epi32(0x7FFF)));
        let magnitude = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFF_FFFF));
        let is_nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7F80_0000));
        let quiet_nan = _mm256_or_si256(x, _mm256_set1_epi32(0x0040_0000));
        let chosen = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
        let top = _mm256_srli_epi32::<16>(chosen);
        // Pack the eight 32-bit lanes to 16 bits (per 128-bit half), then gather both halves' low
        // 64 bits into the low 128 bits.
        let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(top, top));
        _mm_storeu_si128(
            words.as_mut_ptr().cast::<__m128i>(),
            _mm256_castsi256_si128(packed),
        );
        let kept = _mm256_and_si256(chosen, _mm256_set1_epi32(0xFFFF_0000_u32 as i32));
        _mm256_storeu_si256(values.as_mut_ptr().cast::<__m256i>(), kept);
    }
}

/// [`codec::bf16_decode`] with AVX2.
#[target_feature(enable = "avx2")]
pub(super) fn bf16_decode(dst: &mut [f32], words: &[[u8; 2]], apply: Apply) {
    codec::bf16_decode(dst, words, apply)
}

/// Rounds `values` to IEEE half in place and writes their little-endian bits to `words`, eight
/// at a time (the tail through a padded block, so every value takes the same instruction).
#[target_feature(enable = "avx,f16c")]
pub(super) fn fp16_encode(words: &mut [[u8; 2]], values: &mut [f32]) {
    let n = words.len().min(values.len());
    let (words, values) = (&mut words[..n], &mut values[..n]);
    let mut word_blocks = words.chunks_exact_mut(8);
    let mut value_blocks = values.chunks_exact_mut(8);
    for (w, v) in (&mut word_blocks).zip(&mut value_blocks) {
        fp16_encode_8(
            w.try_into().expect("8 words"),
            v.try_into().expect("8 values"),
        );
    }
    let (w, v) = (word_blocks.into_remainder(), value_blocks.into_remainder());
    if !v.is_empty() {
        let mut padded_words = [[0u8; 2]; 8];
        let mut padded_values = [0f32; 8];
        padded_values[..v.len()].copy_from_slice(v);
        fp16_encode_8(&mut padded_words, &mut padded_values);
        w.copy_from_slice(&padded_words[..w.len()]);
        v.copy_from_slice(&padded_values[..v.len()]);
    }
}

#[target_feature(enable = "avx,f16c")]
fn fp16_encode_8(words: &mut [[u8; 2]; 8], values: &mut [f32; 8]) {
    // SAFETY: both arrays are exactly one vector long; the loads and stores are unaligned ones.
    unsafe {
        let halves = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(values.as_ptr()));
        // x86 is little-endian: the eight 16-bit lanes are the wire's eight words.
        _mm_storeu_si128(words.as_mut_ptr().cast::<__m128i>(), halves);
        _mm256_storeu_ps(values.as_mut_ptr(), _mm256_cvtph_ps(halves));
    }
}

/// Adds (or copies) the IEEE half `words` into `dst`, eight at a time.
#[target_feature(enable = "avx,f16c")]
pub(super) fn fp16_decode(dst: &mut [f32], words: &[[u8; 2]], apply: Apply) {
    let n = words.len().min(dst.len());
    let (dst, words) = (&mut dst[..n], &words[..n]);
    let mut dst_blocks = dst.chunks_exact_mut(8);
    let mut word_blocks = words.chunks_exact(8);
    for (d, w) in (&mut dst_blocks).zip(&mut word_blocks) {
        fp16_decode_8(
            d.try_into().expect("8 values"),
            w.try_into().expect("8 words"),
            apply,
        );
    }
    let (d, w) = (dst_blocks.into_remainder(), word_blocks.remainder());
    if !d.is_empty() {
        let mut padded_dst = [0f32; 8];
        let mut padded_words = [[0u8; 2]; 8];
        padded_dst[..d.len()].copy_from_slice(d);
        padded_words[..w.len()].copy_from_slice(w);
        fp16_decode_8(&mut padded_dst, &padded_words, apply);
        d.copy_from_slice(&padded_dst[..d.len()]);
    }
}

#[target_feature(enable = "avx,f16c")]
fn fp16_decode_8(dst: &mut [f32; 8], words: &[[u8; 2]; 8], apply: Apply) {
    // SAFETY: both arrays are exactly one vector long; the loads and stores are unaligned ones.
    unsafe {
        let decoded = _mm256_cvtph_ps(_mm_loadu_si128(words.as_ptr().cast::<__m128i>()));
        let result = match apply {
            Apply::Add => _mm256_add_ps(_mm256_loadu_ps(dst.as_ptr()), decoded),
            Apply::Copy => decoded,
        };
        _mm256_storeu_ps(dst.as_mut_ptr(), result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values of every magnitude and sign, NaN left out (its payload is the one thing the hardware
    /// and the software conversions may set differently), in a length with a tail.
    fn spread() -> Vec<f32> {
        let mut x = 0x9E37_79B9u32;
        let mut v: Vec<f32> = (0..10_003)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                f32::from_bits(x)
            })
            .filter(|v| !v.is_nan())
            .collect();
        v.extend([
            0.0,
            -0.0,
            65504.0,
            65520.0,
            1.0 + 1.0 / 2048.0,
            6.0e-8,
            f32::INFINITY,
        ]);
        v
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn vector_codecs_give_the_portable_codecs_results_bit_for_bit() {
        let simd = [std::arch::is_x86_feature_detected!("avx2"), has_f16c()];
        if simd.contains(&false) {
            eprintln!("this CPU lacks AVX2 or F16C: nothing to compare");
            return;
        }
        type Encode = fn(&mut [[u8; 2]], &mut [f32]);
        type Decode = fn(&mut [f32], &[[u8; 2]], Apply);
        let bf16: (Encode, Encode, Decode, Decode) = (
            |w, v| unsafe { bf16_encode(w, v) },
            codec::bf16_encode,
            |d, w, a| unsafe { bf16_decode(d, w, a) },
            codec::bf16_decode,
        );
        let fp16: (Encode, Encode, Decode, Decode) = (
            |w, v| unsafe { fp16_encode(w, v) },
            codec::fp16_encode,
            |d, w, a| unsafe { fp16_decode(d, w, a) },
            codec::fp16_decode,
        );
        for (name, (vector_encode, portable_encode, vector_decode, portable_decode)) in
            [("bf16", bf16), ("fp16", fp16)]
        {
            let (mut fast, mut slow) = (spread(), spread());
            let mut fast_words = vec![[0u8; 2]; fast.len()];
            let mut slow_words = fast_words.clone();
            vector_encode(&mut fast_words, &mut fast);
            portable_encode(&mut slow_words, &mut slow);
            assert_eq!(fast_words, slow_words, "{name} wire words");
            assert_eq!(bits(&fast), bits(&slow), "{name} values kept");
            for apply in [Apply::Add, Apply::Copy] {
                let mut fast_dst: Vec<f32> = (0..fast.len()).map(|i| i as f32 * 0.5).collect();
                let mut slow_dst = fast_dst.clone();
                vector_decode(&mut fast_dst, &fast_words, apply);
                portable_decode(&mut slow_dst, &slow_words, apply);
                assert_eq!(bits(&fast_dst), bits(&slow_dst), "{name} {apply:?}");
            }
        }
    }
}
