//! Gradient compression on the wire (`dataParallel.compression`, as DDP's bf16/fp16 compress
//! hooks and Horovod's fp16 compression): values travel as 16-bit floats, half the bytes, and are
//! reduced in f32 on arrival.
//!
//! Every rank stays bitwise identical because a rank rounds the values it sends *in place*
//! before sending them: what it keeps is exactly what its peers decode (16-bit to f32 is exact),
//! so both ends of every exchange hold the same numbers, and rounding again is a no-op.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

mod codec;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::error::CollectiveError;
use crate::kernels::{Apply, add_from_le, copy_from_le, le_bytes};

/// How an all-reduce's values travel between ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// As f32: exact.
    #[default]
    None,
    /// As bfloat16: f32's range, 8 bits of mantissa.
    Bf16,
    /// As IEEE half: 11 bits of mantissa, magnitudes up to 65504 (larger become infinite).
    Fp16,
}

impl Compression {
    /// Bytes one value takes on the wire.
    pub fn bytes_per_value(self) -> usize {
        match self {
            Compression::None => 4,
            Compression::Bf16 | Compression::Fp16 => 2,
        }
    }

    /// Rounds `values` in place to what the wire carries and appends their little-endian 16-bit
    /// encoding to `out` (nothing for `None`: f32 values go out as they are).
    pub(crate) fn round_and_encode(self, values: &mut [f32], out: &mut Vec<u8>) {
        if self == Compression::None {
            return;
        }
        let start = out.len();
        out.resize(start + values.len() * 2, 0);
        let (words, _) = out[start..].as_chunks_mut::<2>();
        match self {
            Compression::None => {}
            Compression::Bf16 => {
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: this CPU has AVX2 (checked just above).
                    return unsafe { x86::bf16_encode(words, values) };
                }
                codec::bf16_encode(words, values)
            }
            Compression::Fp16 => {
                #[cfg(target_arch = "x86_64")]
                if x86::has_f16c() {
                    // SAFETY: this CPU has AVX and F16C (checked just above).
                    return unsafe { x86::fp16_encode(words, values) };
                }
                codec::fp16_encode(words, values)
            }
        }
    }

    /// The wire bytes of `values`: their own memory for f32 (no copy on a little-endian
    /// machine), else rounded in place and encoded into `scratch`.
    pub(crate) fn wire_bytes<'a>(
        self,
        values: &'a mut [f32],
        scratch: &'a mut Vec<u8>,
    ) -> Cow<'a, [u8]> {
        match self {
            Compression::None => le_bytes(values),
            _ => {
                scratch.clear();
                self.round_and_encode(values, scratch);
                Cow::Borrowed(&scratch[..])
            }
        }
    }

    /// Applies the wire values in `src` to `dst`; `src` holds exactly
    /// `dst.len() * bytes_per_value()` bytes (checked by the caller).
    pub(crate) fn decode_apply(self, dst: &mut [f32], src: &[u8], apply: Apply) {
        let (words, _) = src.as_chunks::<2>();
        match self {
            Compression::None => match apply {
                Apply::Add => add_from_le(dst, src),
                Apply::Copy => copy_from_le(dst, src),
            },
            Compression::Bf16 => {
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: this CPU has AVX2 (checked just above).
                    return unsafe { x86::bf16_decode(dst, words, apply) };
                }
                codec::bf16_decode(dst, words, apply)
            }
            Compression::Fp16 => {
                #[cfg(target_arch = "x86_64")]
                if x86::has_f16c() {
                    // SAFETY: this CPU has AVX and F16C (checked just above).
                    return unsafe { x86::fp16_decode(dst, words, apply) };
                }
                codec::fp16_decode(dst, words, apply)
            }
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Compression::None => "none",
            Compression::Bf16 => "bf16",
            Compression::Fp16 => "fp16",
        })
    }
}

impl FromStr for Compression {
    type Err = CollectiveError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Compression::None),
            "bf16" => Ok(Compression::Bf16),
            "fp16" => Ok(Compression::Fp16),
            other => Err(CollectiveError::invalid_config(
                "compression",
                format!("unknown compression {other:?}; use none, bf16 or fp16"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> Vec<f32> {
        let mut v: Vec<f32> = (0..2000).map(|i| (i as f32 - 1000.0) * 0.0137).collect();
        v.extend([0.0, -0.0, 1e-9, 3.0e38, -70000.0, f32::INFINITY]);
        v
    }

    #[test]
    fn what_is_kept_is_what_the_peer_decodes_and_rounding_again_changes_nothing() {
        for compression in [Compression::Bf16, Compression::Fp16] {
            let mut kept = values();
            let mut wire = Vec::new();
            compression.round_and_encode(&mut kept, &mut wire);
            assert_eq!(wire.len(), kept.len() * 2, "half the bytes");
            let mut decoded = vec![0f32; kept.len()];
            compression.decode_apply(&mut decoded, &wire, Apply::Copy);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&decoded), bits(&kept), "{compression}");
            let mut again = kept.clone();
            let mut wire_again = Vec::new();
            compression.round_and_encode(&mut again, &mut wire_again);
            assert_eq!(wire_again, wire, "{compression}");
            assert_eq!(bits(&again), bits(&kept), "{compression}");
        }
    }

    #[test]
    fn bf16_rounding_matches_the_half_crate_bit_for_bit() {
        let mut bits: Vec<u32> = vec![
            0x3F80_8000, // a tie: rounds to even (down)
            0x3F81_8000, // a tie: rounds to even (up)
            0x7F7F_FFFF, // f32::MAX: overflows to infinity
            0x7F80_0000, // infinity
            0x7F80_0001, // a signalling NaN: stays a NaN
            0xFFC0_0000, // a negative quiet NaN
            0x0000_0001, // the smallest subnormal
            0x8000_0000, // -0
        ];
        // And a spread over every exponent and sign.
        let mut x = 0x2545_F491u32;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            bits.push(x);
        }
        for b in bits {
            let v = f32::from_bits(b);
            assert_eq!(
                codec::bf16_bits(v),
                half::bf16::from_f32(v).to_bits(),
                "{b:#010x}"
            );
        }
    }

    #[test]
    fn bf16_keeps_f32_range_and_fp16_saturates_to_infinity() {
        let mut v = [3.0e38f32, -70000.0, 1.0 + 1.0 / 512.0];
        Compression::Bf16.round_and_encode(&mut v, &mut Vec::new());
        assert!(v[0].is_finite() && (v[0] / 3.0e38 - 1.0).abs() < 0.01);
        assert_eq!(v[1], -70144.0);
        assert_eq!(v[2], 1.0, "8 bits of mantissa");
        let mut v = [3.0e38f32, -70000.0, 1.0 + 1.0 / 512.0];
        Compression::Fp16.round_and_encode(&mut v, &mut Vec::new());
        assert_eq!(v[0], f32::INFINITY);
        assert_eq!(v[1], f32::NEG_INFINITY);
        assert_eq!(v[2], 1.0 + 1.0 / 512.0, "11 bits of mantissa");
    }

    #[test]
    fn uncompressed_payloads_are_plain_f32_and_add_or_copy() {
        let src: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mut dst = [1.0f32, 1.0];
        Compression::None.decode_apply(&mut dst, &src, Apply::Add);
        assert_eq!(dst, [2.5, -1.0]);
        Compression::None.decode_apply(&mut dst, &src, Apply::Copy);
        assert_eq!(dst, [1.5, -2.0]);
        let mut kept = [0.1f32];
        let mut out = Vec::new();
        Compression::None.round_and_encode(&mut kept, &mut out);
        assert!(out.is_empty() && kept == [0.1]);
    }
}
