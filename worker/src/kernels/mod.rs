//! The matrix products of a training step and the kernels that compute them: matrixmultiply (the default, the same
//! bits on every run) and the `gemm` crate, faster on some shapes of some CPUs. A [`KernelPlan`] says which kernel
//! computes each product; `spec.model.kernels: measured` makes one at start by timing both on the step's own
//! shapes (as cuDNN's benchmark mode or an FFTW plan), `fixed` keeps matrixmultiply everywhere.

mod gemm_crate;
mod matrixmultiply_kernel;

use std::fmt;
use std::time::{Duration, Instant};

/// A kernel that computes `c = a · b + beta × c`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    MatrixMultiply,
    GemmCrate,
}

impl Kernel {
    /// Every kernel, the default first.
    pub const ALL: [Kernel; 2] = [Kernel::MatrixMultiply, Kernel::GemmCrate];

    pub fn name(self) -> &'static str {
        match self {
            Kernel::MatrixMultiply => "matrixmultiply",
            Kernel::GemmCrate => "gemm",
        }
    }

    /// `c = a · b + beta × c` for the product `p`, `a`, `b` and `c` stored as `p` says (row-major, read
    /// transposed where it says so).
    ///
    /// # Panics
    /// When a slice is shorter than its matrix.
    pub fn run(self, p: Product, a: &[f32], b: &[f32], beta: f32, c: &mut [f32]) {
        assert!(
            a.len() >= p.m * p.k && b.len() >= p.k * p.n && c.len() >= p.m * p.n,
            "gemm: a slice is shorter than its matrix ({p})"
        );
        let strides = p.strides();
        // SAFETY: each kernel reads a[i·rsa + q·csa] (i < m, q < k) and b[q·rsb + j·csb] (q < k, j < n) and
        // writes c[i·n + j]; with the strides of a contiguous (possibly transposed) matrix the largest of each is
        // below m·k, k·n and m·n, which the assertion above checked against the slices.
        unsafe {
            match self {
                Kernel::MatrixMultiply => matrixmultiply_kernel::sgemm(p, strides, a, b, beta, c),
                Kernel::GemmCrate => gemm_crate::sgemm(p, strides, a, b, beta, c),
            }
        }
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One matrix product: `c (m × n) = a (m × k) · b (k × n)`, each matrix stored contiguously, row-major, `a`
/// and/or `b` stored transposed (as the backward pass reads the activations and the weights).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Product {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub a_transposed: bool,
    pub b_transposed: bool,
}

/// (row stride, column stride) of `a`, then of `b`.
type Strides = ((usize, usize), (usize, usize));

impl Product {
    /// `a (m × k) · b (k × n)`, neither transposed.
    pub fn plain(m: usize, k: usize, n: usize) -> Product {
        Product {
            m,
            k,
            n,
            a_transposed: false,
            b_transposed: false,
        }
    }

    pub fn flops(&self) -> f64 {
        2.0 * (self.m * self.k * self.n) as f64
    }

    /// (row stride, column stride) of `a` and of `b` as stored.
    pub fn strides(&self) -> Strides {
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

    /// Floats of `a`, `b` and `c` together.
    fn floats(&self) -> usize {
        self.m * self.k + self.k * self.n + self.m * self.n
    }
}

impl fmt::Display for Product {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = |transposed: bool| if transposed { "ᵀ" } else { "" };
        write!(
            f,
            "{}x{}x{} (a{} b{})",
            self.m,
            self.k,
            self.n,
            t(self.a_transposed),
            t(self.b_transposed)
        )
    }
}

/// Which kernel computes each product; products it does not list use [`Kernel::MatrixMultiply`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KernelPlan {
    chosen: Vec<Choice>,
}

/// One product's timing and the kernel chosen for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    pub product: Product,
    pub kernel: Kernel,
    /// Each kernel's best GFLOP/s on the product, in [`Kernel::ALL`]'s order (0 for a kernel whose result
    /// disagreed with the default's, which is never chosen; empty when the choice was not timed).
    pub gflops: Vec<f64>,
}

/// Products larger than this (floats of `a`, `b` and `c`, 64 MiB) are not timed at start: the default computes
/// them (timing would double the memory of the largest layers).
const MAX_TIMED_FLOATS: usize = 16 << 20;
/// Nor are products of more floating-point operations than this per call (about 30 ms at 60 GFLOP/s).
const MAX_TIMED_FLOPS: f64 = 2e9;
/// A kernel other than the default is chosen only when it is at least this much faster: a closer race is noise.
const MARGIN: f64 = 1.03;

impl KernelPlan {
    /// Matrixmultiply everywhere: the same bits on every run, every machine with the same instruction set.
    pub fn fixed() -> KernelPlan {
        KernelPlan::default()
    }

    /// Times every kernel on each product (the best of `repeats` runs of at least `each` each, after one
    /// untimed call) and chooses the fastest; a kernel whose result differs from the default's by more than
    /// rounding is never chosen. Products too large to time keep the default.
    pub fn measure(products: &[Product], each: Duration, repeats: usize) -> KernelPlan {
        let mut chosen: Vec<Choice> = Vec::new();
        for &product in products {
            if chosen.iter().any(|c| c.product == product)
                || product.floats() > MAX_TIMED_FLOATS
                || product.flops() > MAX_TIMED_FLOPS
                || product.flops() == 0.0
            {
                continue;
            }
            chosen.push(time_kernels(product, each, repeats));
        }
        KernelPlan { chosen }
    }

    /// `kernel` for every product of `products` (not timed): to compare kernels on the same work.
    pub fn only(kernel: Kernel, products: &[Product]) -> KernelPlan {
        let chosen = products
            .iter()
            .map(|&product| Choice {
                product,
                kernel,
                gflops: Vec::new(),
            })
            .collect();
        KernelPlan { chosen }
    }

    /// The kernel that computes `p`.
    pub fn kernel_for(&self, p: Product) -> Kernel {
        self.chosen
            .iter()
            .find(|c| c.product == p)
            .map_or(Kernel::MatrixMultiply, |c| c.kernel)
    }

    /// `c = a · b + beta × c` with the kernel chosen for `p`.
    pub fn gemm(&self, p: Product, a: &[f32], b: &[f32], beta: f32, c: &mut [f32]) {
        self.kernel_for(p).run(p, a, b, beta, c);
    }

    /// The products timed, with their timings and choices.
    pub fn choices(&self) -> &[Choice] {
        &self.chosen
    }
}

impl fmt::Display for KernelPlan {
    /// `matrixmultiply` for a fixed plan; else each timed product and its kernel.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.chosen.is_empty() {
            return f.write_str(Kernel::MatrixMultiply.name());
        }
        for (i, c) in self.chosen.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{} {}", c.product, c.kernel)?;
        }
        Ok(())
    }
}

/// Deterministic values in [-0.5, 0.5).
pub fn filled(len: usize, seed: u64) -> Vec<f32> {
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

/// Every kernel's best GFLOP/s on `p` and the fastest that agrees with the default.
fn time_kernels(p: Product, each: Duration, repeats: usize) -> Choice {
    let (a, b) = (filled(p.m * p.k, 1), filled(p.k * p.n, 2));
    let mut reference = vec![0f32; p.m * p.n];
    Kernel::MatrixMultiply.run(p, &a, &b, 0.0, &mut reference);
    let mut c = vec![0f32; p.m * p.n];
    let gflops: Vec<f64> = Kernel::ALL
        .iter()
        .map(|&kernel| {
            kernel.run(p, &a, &b, 0.0, &mut c);
            if !agrees(&c, &reference, p.k) {
                return 0.0;
            }
            best_gflops(p.flops(), each, repeats, || {
                kernel.run(p, &a, &b, 0.0, &mut c)
            })
        })
        .collect();
    Choice {
        product: p,
        kernel: Kernel::ALL[choose(&gflops)],
        gflops,
    }
}

/// The index of the kernel to use given each one's GFLOP/s ([`Kernel::ALL`]'s order): the fastest, if it beats
/// the default (index 0) by [`MARGIN`]; else the default.
fn choose(gflops: &[f64]) -> usize {
    let default = gflops.first().copied().unwrap_or(0.0);
    let mut best = 0;
    for (i, &rate) in gflops.iter().enumerate().skip(1) {
        if rate > default * MARGIN && rate > gflops[best] {
            best = i;
        }
    }
    best
}

/// Whether `got` equals `want` up to the rounding of sums of `k` products of values below 0.5.
fn agrees(got: &[f32], want: &[f32], k: usize) -> bool {
    let tolerance = 1e-5 * (k as f32).max(1.0);
    got.iter()
        .zip(want)
        .all(|(g, w)| (g - w).abs() <= tolerance)
}

/// The best rate of `repeats` runs of `work` (`flops` floating-point operations per call), each repeating it for
/// at least `each`, in GFLOP/s.
pub fn best_gflops(flops: f64, each: Duration, repeats: usize, mut work: impl FnMut()) -> f64 {
    work();
    let mut best: f64 = 0.0;
    for _ in 0..repeats.max(1) {
        let started = Instant::now();
        let mut calls = 0u64;
        while calls == 0 || started.elapsed() < each {
            work();
            calls += 1;
        }
        best = best.max(flops * calls as f64 / started.elapsed().as_secs_f64() / 1e9);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `c = a · b` the slow way, reading `a` and `b` through the product's strides.
    fn naive(p: Product, a: &[f32], b: &[f32]) -> Vec<f32> {
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

    fn every_layout(m: usize, k: usize, n: usize) -> Vec<Product> {
        [(false, false), (true, false), (false, true), (true, true)]
            .into_iter()
            .map(|(a_transposed, b_transposed)| Product {
                m,
                k,
                n,
                a_transposed,
                b_transposed,
            })
            .collect()
    }

    #[test]
    fn every_kernel_computes_every_layout_as_the_naive_product_and_adds_beta_times_c() {
        for p in every_layout(7, 5, 3)
            .into_iter()
            .chain(every_layout(33, 17, 9))
        {
            let (a, b) = (filled(p.m * p.k, 1), filled(p.k * p.n, 2));
            let want = naive(p, &a, &b);
            for kernel in Kernel::ALL {
                let mut c = vec![9f32; p.m * p.n];
                kernel.run(p, &a, &b, 0.0, &mut c);
                let worst = c
                    .iter()
                    .zip(&want)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0f32, f32::max);
                assert!(worst < 1e-5, "{kernel} {p}: off by {worst}");
                let mut c = vec![2f32; p.m * p.n];
                kernel.run(p, &a, &b, 0.5, &mut c);
                let worst = c
                    .iter()
                    .zip(&want)
                    .map(|(x, y)| (x - (y + 1.0)).abs())
                    .fold(0f32, f32::max);
                assert!(worst < 1e-5, "{kernel} {p} with beta 0.5: off by {worst}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "shorter than its matrix")]
    fn a_short_slice_is_refused_before_any_kernel_reads_it() {
        let p = Product::plain(4, 4, 4);
        Kernel::GemmCrate.run(p, &[0.0; 15], &[0.0; 16], 0.0, &mut [0.0; 16]);
    }

    #[test]
    fn the_choice_is_the_fastest_kernel_only_when_it_clearly_beats_the_default() {
        for (gflops, want, why) in [
            (vec![60.0, 80.0], 1, "gemm a third faster"),
            (vec![60.0, 61.0], 0, "within the margin: noise"),
            (vec![80.0, 60.0], 0, "the default faster"),
            (vec![60.0, 0.0], 0, "gemm disagreed with the default"),
            (vec![0.0, 0.0], 0, "nothing measured"),
            (vec![60.0], 0, "one kernel"),
        ] {
            assert_eq!(choose(&gflops), want, "{why}: {gflops:?}");
        }
    }

    #[test]
    fn a_fixed_plan_uses_matrixmultiply_for_every_product() {
        let plan = KernelPlan::fixed();
        assert_eq!(
            plan.kernel_for(Product::plain(64, 784, 512)),
            Kernel::MatrixMultiply
        );
        assert_eq!(plan.to_string(), "matrixmultiply");
    }

    #[test]
    fn a_measured_plan_times_each_product_once_and_leaves_the_huge_ones_to_the_default() {
        let small = Product::plain(8, 16, 8);
        let huge = Product::plain(4096, 4096, 4096);
        let plan = KernelPlan::measure(&[small, small, huge], Duration::from_micros(200), 1);
        assert_eq!(plan.choices().len(), 1, "{plan}");
        let choice = &plan.choices()[0];
        assert_eq!(choice.product, small);
        assert!(choice.gflops.iter().all(|g| *g > 0.0), "{choice:?}");
        assert_eq!(plan.kernel_for(small), choice.kernel);
        assert_eq!(plan.kernel_for(huge), Kernel::MatrixMultiply);
        assert!(plan.to_string().starts_with("8x16x8 (a b) "), "{plan}");
    }
}
