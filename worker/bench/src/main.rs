//! `compute-bench`: how close one rank's compute comes to the core's limit, in one run (issue 26). Prints JSON
//! lines: the core's FMA peak (a register-only loop of independent AVX2 FMA chains), the sgemm GFLOP/s of each
//! matrix product one training step of the MLP makes, with matrixmultiply (what the worker uses) beside the
//! `gemm` crate, and the whole training step's GFLOP/s (`Mlp::batch_grad`, one thread), each as a fraction of the
//! peak. Everything single-threaded: a rank computes on one thread per tile.
//!
//!     cargo run --release -p rdu-compute-bench -- --batch 64 --hidden 512,512

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Parser;
use rdu_worker::model::Mlp;
use serde_json::json;

#[derive(Parser)]
#[command(
    name = "compute-bench",
    about = "FMA peak, sgemm and training-step GFLOP/s on one core"
)]
struct Args {
    /// Samples per batch (per rank).
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Input features.
    #[arg(long, default_value_t = 784)]
    input: usize,
    /// Hidden layer sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "512,512")]
    hidden: Vec<usize>,
    /// Classes.
    #[arg(long, default_value_t = 10)]
    classes: usize,
    /// How long each measurement runs; the best of `--repeats` is kept.
    #[arg(long, default_value_t = 0.3)]
    seconds: f64,
    #[arg(long, default_value_t = 5)]
    repeats: usize,
}

/// The best rate of `repeats` runs of `work` (which does `flops` floating-point operations per call), each
/// repeating it for at least `seconds`: GFLOP/s.
fn best_gflops(flops: f64, seconds: f64, repeats: usize, mut work: impl FnMut()) -> f64 {
    work();
    let mut best: f64 = 0.0;
    for _ in 0..repeats {
        let started = Instant::now();
        let mut calls = 0u64;
        while started.elapsed() < Duration::from_secs_f64(seconds) {
            work();
            calls += 1;
        }
        best = best.max(flops * calls as f64 / started.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// Independent FMA chains in the loop: enough to cover the FMA units' latency × throughput (4 × 2 on
/// recent x86 cores) with room to spare, few enough to stay in the 16 AVX2 registers.
const CHAINS: usize = 12;

/// `iterations` rounds of `CHAINS` independent FMAs on one register each (`$set`, `$fma`, `$add` and `$store`
/// the width's intrinsics, `$lanes` its floats); returns a sum so that none is dropped. One local per chain, so
/// the chains stay in registers (an array of them was kept in memory, halving the rate).
macro_rules! fma_chains {
    ($iterations:expr, $lanes:expr, $set:ident, $fma:ident, $add:ident, $store:ident) => {{
        let (a, b) = ($set(0.999_999), $set(1e-7));
        let [mut c0, mut c1, mut c2, mut c3, mut c4, mut c5] = [$set(1.0); 6];
        let [mut c6, mut c7, mut c8, mut c9, mut c10, mut c11] = [$set(1.0); 6];
        for _ in 0..$iterations {
            c0 = $fma(c0, a, b);
            c1 = $fma(c1, a, b);
            c2 = $fma(c2, a, b);
            c3 = $fma(c3, a, b);
            c4 = $fma(c4, a, b);
            c5 = $fma(c5, a, b);
            c6 = $fma(c6, a, b);
            c7 = $fma(c7, a, b);
            c8 = $fma(c8, a, b);
            c9 = $fma(c9, a, b);
            c10 = $fma(c10, a, b);
            c11 = $fma(c11, a, b);
        }
        let sum = [c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11]
            .into_iter()
            .fold(c0, |s, c| $add(s, c));
        let mut lanes = [0f32; $lanes];
        // SAFETY: `lanes` holds the floats the unaligned store writes.
        unsafe { $store(lanes.as_mut_ptr(), sum) };
        lanes.iter().sum::<f32>()
    }};
}

/// AVX2: 8 lanes per FMA.
///
/// # Safety
/// The CPU must support AVX2 and FMA (`is_x86_feature_detected!`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_chains_avx2(iterations: u64) -> f32 {
    use std::arch::x86_64::{_mm256_add_ps, _mm256_fmadd_ps, _mm256_set1_ps, _mm256_storeu_ps};
    fma_chains!(
        iterations,
        8,
        _mm256_set1_ps,
        _mm256_fmadd_ps,
        _mm256_add_ps,
        _mm256_storeu_ps
    )
}

/// AVX-512: 16 lanes per FMA.
///
/// # Safety
/// The CPU must support AVX-512F (`is_x86_feature_detected!`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_chains_avx512(iterations: u64) -> f32 {
    use std::arch::x86_64::{_mm512_add_ps, _mm512_fmadd_ps, _mm512_set1_ps, _mm512_storeu_ps};
    fma_chains!(
        iterations,
        16,
        _mm512_set1_ps,
        _mm512_fmadd_ps,
        _mm512_add_ps,
        _mm512_storeu_ps
    )
}

/// The core's FMA peak in GFLOP/s (lanes × 2 operations per FMA) with AVX2 and with AVX-512, where the CPU has
/// them.
fn fma_peaks(seconds: f64, repeats: usize) -> (Option<f64>, Option<f64>) {
    const ITERATIONS: u64 = 1 << 20;
    let flops = |lanes: u64| (ITERATIONS * CHAINS as u64 * lanes * 2) as f64;
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 =
            (is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")).then(|| {
                best_gflops(flops(8), seconds, repeats, || {
                    // SAFETY: AVX2 and FMA were detected.
                    black_box(unsafe { fma_chains_avx2(black_box(ITERATIONS)) });
                })
            });
        let avx512 = is_x86_feature_detected!("avx512f").then(|| {
            best_gflops(flops(16), seconds, repeats, || {
                // SAFETY: AVX-512F was detected.
                black_box(unsafe { fma_chains_avx512(black_box(ITERATIONS)) });
            })
        });
        (avx2, avx512)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (seconds, repeats, flops);
        (None, None)
    }
}

/// One matrix product of a training step: `c (m × n) = a (m × k) · b (k × n)`, `a` and/or `b` read transposed
/// (as the backward pass reads the activations and the weights).
struct Product {
    name: String,
    m: usize,
    k: usize,
    n: usize,
    a_transposed: bool,
    b_transposed: bool,
}

impl Product {
    fn flops(&self) -> f64 {
        2.0 * (self.m * self.k * self.n) as f64
    }

    /// (row stride, column stride) of `a` and `b` as stored.
    fn strides(&self) -> ((usize, usize), (usize, usize)) {
        let a = if self.a_transposed {
            (1, self.m)
        } else {
            (self.k, 1)
        };
        let b = if self.b_transposed {
            (1, self.k)
        } else {
            (self.n, 1)
        };
        (a, b)
    }
}

/// The products of one forward and backward pass of an MLP with layer sizes `sizes` on `batch` rows: per layer
/// the forward `X·W`, the weight gradient `Xᵀ·dZ` and, except for the first layer, the input gradient `dZ·Wᵀ`.
fn step_products(sizes: &[usize], batch: usize) -> Vec<Product> {
    let mut out = Vec::new();
    for (layer, pair) in sizes.windows(2).enumerate() {
        let (fan_in, fan_out) = (pair[0], pair[1]);
        let product = |kind: &str, (m, k, n), a_transposed, b_transposed| Product {
            name: format!("layer{layer}.{kind} {m}x{k}x{n}"),
            m,
            k,
            n,
            a_transposed,
            b_transposed,
        };
        out.push(product("forward", (batch, fan_in, fan_out), false, false));
        out.push(product(
            "weight_grad",
            (fan_in, batch, fan_out),
            true,
            false,
        ));
        if layer > 0 {
            out.push(product("input_grad", (batch, fan_out, fan_in), false, true));
        }
    }
    out
}

/// Deterministic values in [-0.5, 0.5).
fn filled(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

/// The product as training computes it: the worker's own `model::gemm` (matrixmultiply).
fn matrixmultiply_sgemm(p: &Product, a: &[f32], b: &[f32], c: &mut [f32]) {
    let ((rsa, csa), (rsb, csb)) = p.strides();
    rdu_worker::model::gemm((p.m, p.k, p.n), (a, rsa, csa), (b, rsb, csb), 0.0, c);
}

fn gemm_crate_sgemm(p: &Product, a: &[f32], b: &[f32], c: &mut [f32]) {
    let ((rsa, csa), (rsb, csb)) = p.strides();
    assert!(a.len() >= p.m * p.k && b.len() >= p.k * p.n && c.len() >= p.m * p.n);
    // SAFETY: with these strides gemm reads a[..m·k], b[..k·n] and writes c[..m·n], inside the slices (checked);
    // it computes dst := alpha·dst + beta·lhs·rhs, and with read_dst false it only writes
    // dst (c[..m·n]).
    unsafe {
        gemm::gemm(
            p.m,
            p.n,
            p.k,
            c.as_mut_ptr(),
            1,
            p.n as isize,
            false,
            a.as_ptr(),
            csa as isize,
            rsa as isize,
            b.as_ptr(),
            csb as isize,
            rsb as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

fn main() -> anyhow::Result<()> {
    // SAFETY: first thing in main, before any other thread exists.
    unsafe { rdu_worker::single_threaded_gemm() };
    let args = Args::parse();
    if args.batch == 0 || args.input == 0 || args.classes == 0 || args.hidden.contains(&0) {
        bail!("--batch, --input, --classes and every --hidden size must be at least 1");
    }
    if !(args.seconds > 0.0 && args.seconds <= 60.0) || args.repeats == 0 {
        bail!("--seconds must be in (0, 60] and --repeats at least 1");
    }
    let (avx2, avx512) = fma_peaks(args.seconds, args.repeats);
    // The peak is the widest FMA the core has: what a GEMM kernel for this core could reach.
    let peak = avx512.or(avx2);
    println!(
        "{}",
        json!({"bench": "fma_peak", "gflops": peak, "avx2_gflops": avx2, "avx512_gflops": avx512,
               "chains": CHAINS})
    );
    let fraction = |gflops: f64| peak.map(|p| gflops / p);

    let mut sizes = vec![args.input];
    sizes.extend(&args.hidden);
    sizes.push(args.classes);
    let products = step_products(&sizes, args.batch);
    let (mut step_flops, mut best_flops_time) = (0.0, 0.0);
    for (i, p) in products.iter().enumerate() {
        let a = filled(p.m * p.k, 2 * i as u64 + 1);
        let b = filled(p.k * p.n, 2 * i as u64 + 2);
        let (mut c1, mut c2) = (vec![0f32; p.m * p.n], vec![0f32; p.m * p.n]);
        matrixmultiply_sgemm(p, &a, &b, &mut c1);
        gemm_crate_sgemm(p, &a, &b, &mut c2);
        let worst = c1
            .iter()
            .zip(&c2)
            .map(|(x, y)| (x - y).abs() / x.abs().max(1.0))
            .fold(0f32, f32::max);
        if worst > 1e-3 {
            bail!(
                "{}: matrixmultiply and gemm disagree (relative error {worst})",
                p.name
            );
        }
        let mm = best_gflops(p.flops(), args.seconds, args.repeats, || {
            matrixmultiply_sgemm(p, &a, &b, &mut c1)
        });
        let gm = best_gflops(p.flops(), args.seconds, args.repeats, || {
            gemm_crate_sgemm(p, &a, &b, &mut c2)
        });
        step_flops += p.flops();
        best_flops_time += p.flops() / (mm.max(gm) * 1e9);
        println!(
            "{}",
            json!({"bench": "sgemm", "product": p.name, "m": p.m, "k": p.k, "n": p.n,
                   "matrixmultiply_gflops": mm, "gemm_crate_gflops": gm,
                   "matrixmultiply_of_peak": fraction(mm), "gemm_crate_of_peak": fraction(gm)})
        );
    }

    let model = Mlp::new(args.input, &args.hidden, args.classes);
    let params = model.init(7);
    let x = filled(args.batch * args.input, 99);
    let y: Vec<u32> = (0..args.batch).map(|i| (i % args.classes) as u32).collect();
    let mut grad = vec![0f32; params.len()];
    let step = best_gflops(step_flops, args.seconds, args.repeats, || {
        black_box(model.batch_grad(&params, &x, &y, 1, &mut grad));
    });
    let products_only = step_flops / best_flops_time / 1e9;
    println!(
        "{}",
        json!({"bench": "train_step", "layers": sizes, "batch": args.batch,
               "mflop_per_sample": step_flops / args.batch as f64 / 1e6,
               "gflops": step, "of_peak": fraction(step),
               "samples_per_second": step * 1e9 / step_flops * args.batch as f64,
               "best_sgemms_only_gflops": products_only,
               "best_sgemms_only_of_peak": fraction(products_only)})
    );
    if grad.iter().any(|g| !g.is_finite()) {
        bail!("train step: the gradient is not finite");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `c = a · b` the slow way, reading `a` and `b` through the product's strides.
    fn naive(p: &Product, a: &[f32], b: &[f32]) -> Vec<f32> {
        let ((rsa, csa), (rsb, csb)) = p.strides();
        let mut c = vec![0f32; p.m * p.n];
        for i in 0..p.m {
            for j in 0..p.n {
                c[i * p.n + j] = (0..p.k)
                    .map(|q| a[i * rsa + q * csa] * b[q * rsb + j * csb])
                    .sum();
            }
        }
        c
    }

    #[test]
    fn a_step_makes_the_products_of_forward_and_backward() {
        let names: Vec<String> = step_products(&[6, 4, 3], 5)
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(
            names,
            [
                "layer0.forward 5x6x4",
                "layer0.weight_grad 6x5x4",
                "layer1.forward 5x4x3",
                "layer1.weight_grad 4x5x3",
                "layer1.input_grad 5x3x4",
            ]
        );
        let flops: f64 = step_products(&[784, 512, 512, 10], 64)
            .iter()
            .map(Product::flops)
            .sum();
        assert_eq!(flops / 64.0, 3_209_216.0, "3.2 MFLOP per sample");
    }

    #[test]
    fn both_gemms_compute_every_product_as_the_naive_one() {
        for p in step_products(&[7, 5, 3], 4) {
            let a = filled(p.m * p.k, 1);
            let b = filled(p.k * p.n, 2);
            let want = naive(&p, &a, &b);
            let (mut c1, mut c2) = (vec![9f32; p.m * p.n], vec![9f32; p.m * p.n]);
            matrixmultiply_sgemm(&p, &a, &b, &mut c1);
            gemm_crate_sgemm(&p, &a, &b, &mut c2);
            for (got, which) in [(&c1, "matrixmultiply"), (&c2, "gemm")] {
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0f32, f32::max);
                assert!(worst < 1e-5, "{which} {}: off by {worst}", p.name);
            }
        }
    }

    #[test]
    fn the_fma_loop_measures_a_positive_rate_where_the_cpu_has_it() {
        let (avx2, avx512) = fma_peaks(0.01, 1);
        for rate in [avx2, avx512].into_iter().flatten() {
            assert!(rate > 0.0 && rate.is_finite(), "{rate}");
        }
    }
}
