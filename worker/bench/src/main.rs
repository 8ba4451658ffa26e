//! `compute-bench`: how close one rank's compute comes to the core's limit, in one run (issues 26 and 38). Prints
//! JSON lines: the core's FMA peak (a register-only loop of independent AVX2 FMA chains); for each matrix product
//! one training step of the MLP makes, every kernel's GFLOP/s and the one the plan the worker makes with
//! `spec.model.kernels: measured` chooses; and the whole training step's GFLOP/s (`Mlp::batch_grad`, one thread)
//! with that plan and with the fixed one, each as a fraction of the peak. Everything single-threaded: a rank
//! computes on one thread per tile.
//!
//!     cargo run --release -p rdu-compute-bench -- --batch 64 --hidden 512,512

use std::hint::black_box;
use std::time::Duration;

use anyhow::bail;
use clap::Parser;
use rdu_worker::{Kernel, KernelPlan, Mlp, Product, best_gflops, filled};
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
                best_gflops(flops(8), Duration::from_secs_f64(seconds), repeats, || {
                    // SAFETY: AVX2 and FMA were detected.
                    black_box(unsafe { fma_chains_avx2(black_box(ITERATIONS)) });
                })
            });
        let avx512 = is_x86_feature_detected!("avx512f").then(|| {
            best_gflops(flops(16), Duration::from_secs_f64(seconds), repeats, || {
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

/// Each product's name in [`Mlp::step_products`]' order: per layer the forward product, the weight gradient and,
/// except for the first layer, the input gradient.
fn product_names(model: &Mlp, batch: usize) -> Vec<String> {
    let products = model.step_products(batch);
    let mut products = products.iter();
    let mut names = Vec::new();
    for layer in 0..model.sizes().len() - 1 {
        let kinds: &[&str] = if layer == 0 {
            &["forward", "weight_grad"]
        } else {
            &["forward", "weight_grad", "input_grad"]
        };
        for kind in kinds {
            let p = products.next().expect("a product per kind");
            names.push(format!("layer{layer}.{kind} {}x{}x{}", p.m, p.k, p.n));
        }
    }
    names
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

    let fixed = Mlp::new(args.input, &args.hidden, args.classes);
    let products = fixed.step_products(args.batch);
    // The plan the worker makes at start with `spec.model.kernels: measured`, timed longer here.
    let each = Duration::from_secs_f64(args.seconds);
    let plan = KernelPlan::measure(&products, each, args.repeats);
    let step_flops: f64 = products.iter().map(Product::flops).sum();
    let mut chosen_time = 0.0;
    for (p, name) in products.iter().zip(product_names(&fixed, args.batch)) {
        let Some(choice) = plan.choices().iter().find(|c| c.product == *p) else {
            bail!("{name}: not timed (too large for a plan at start)");
        };
        if choice.gflops.contains(&0.0) {
            bail!(
                "{name}: a kernel disagreed with matrixmultiply: {:?}",
                choice.gflops
            );
        }
        let chosen = Kernel::ALL
            .iter()
            .zip(&choice.gflops)
            .find_map(|(k, g)| (*k == choice.kernel).then_some(*g))
            .unwrap_or_default();
        chosen_time += p.flops() / (chosen * 1e9);
        let rates: serde_json::Map<String, serde_json::Value> = Kernel::ALL
            .iter()
            .zip(&choice.gflops)
            .map(|(k, g)| (k.name().to_string(), json!(g)))
            .collect();
        println!(
            "{}",
            json!({"bench": "sgemm", "product": name, "m": p.m, "k": p.k, "n": p.n,
                   "a_transposed": p.a_transposed, "b_transposed": p.b_transposed,
                   "gflops": rates, "chosen": choice.kernel.name(), "chosen_of_peak": fraction(chosen)})
        );
    }

    let measured = fixed.clone().with_kernels(plan);
    let params = fixed.init(7);
    let x = filled(args.batch * args.input, 99);
    let y: Vec<u32> = (0..args.batch).map(|i| (i % args.classes) as u32).collect();
    let mut grad = vec![0f32; params.len()];
    let mut step = |model: &Mlp| {
        best_gflops(step_flops, each, args.repeats, || {
            black_box(model.batch_grad(&params, &x, &y, 1, &mut grad));
        })
    };
    let (fixed_step, measured_step) = (step(&fixed), step(&measured));
    let products_only = step_flops / chosen_time / 1e9;
    println!(
        "{}",
        json!({"bench": "train_step", "layers": fixed.sizes(), "batch": args.batch,
               "mflop_per_sample": step_flops / args.batch as f64 / 1e6,
               "kernels": "measured", "gflops": measured_step, "of_peak": fraction(measured_step),
               "samples_per_second": measured_step * 1e9 / step_flops * args.batch as f64,
               "fixed_gflops": fixed_step, "fixed_of_peak": fraction(fixed_step),
               "chosen_sgemms_only_gflops": products_only,
               "chosen_sgemms_only_of_peak": fraction(products_only)})
    );
    if grad.iter().any(|g| !g.is_finite()) {
        bail!("train step: the gradient is not finite");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_makes_the_products_of_forward_and_backward() {
        let model = Mlp::new(6, &[4], 3);
        assert_eq!(
            product_names(&model, 5),
            [
                "layer0.forward 5x6x4",
                "layer0.weight_grad 6x5x4",
                "layer1.forward 5x4x3",
                "layer1.weight_grad 4x5x3",
                "layer1.input_grad 5x3x4",
            ]
        );
        let flops: f64 = Mlp::new(784, &[512, 512], 10)
            .step_products(64)
            .iter()
            .map(Product::flops)
            .sum();
        assert_eq!(flops / 64.0, 3_209_216.0, "3.2 MFLOP per sample");
    }

    #[test]
    fn the_fma_loop_measures_a_positive_rate_where_the_cpu_has_it() {
        let (avx2, avx512) = fma_peaks(0.01, 1);
        for rate in [avx2, avx512].into_iter().flatten() {
            assert!(rate > 0.0 && rate.is_finite(), "{rate}");
        }
    }
}
