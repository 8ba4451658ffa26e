//! `ffn-logreg`: hidden ReLU layers then a softmax-regression layer, with its parameters in one flat
//! f32 buffer (so the gradient is one contiguous buffer to all-reduce). Each matrix product goes through the
//! model's [`KernelPlan`]; a batch is split across the rank's tiles, one compute thread per tile.

use rdu_crds::ModelSpec;

use crate::buckets::{self, Bucket};
use crate::data::Splits;
use crate::kernels::{KernelPlan, Product};
use crate::rng::Rng;

const INIT_STREAM: u64 = 0x1417;

/// Layer widths, input first and classes last; weights are `in × out` row-major, then the bias. The kernel plan
/// says which kernel computes each product (a fixed one unless [`Mlp::with_kernels`] set another).
#[derive(Debug, Clone, PartialEq)]
pub struct Mlp {
    sizes: Vec<usize>,
    kernels: KernelPlan,
}

/// Sums over a batch: cross-entropy loss, correct predictions, samples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BatchStats {
    pub loss_sum: f64,
    pub correct: u64,
    pub samples: u64,
}

impl BatchStats {
    pub fn add(&mut self, other: BatchStats) {
        self.loss_sum += other.loss_sum;
        self.correct += other.correct;
        self.samples += other.samples;
    }

    pub fn mean_loss(&self) -> f64 {
        self.loss_sum / self.samples.max(1) as f64
    }

    pub fn accuracy(&self) -> f64 {
        self.correct as f64 / self.samples.max(1) as f64
    }
}

impl Mlp {
    /// The job's model: `spec.model.hiddenSizes` between the data's input width and its number of classes.
    pub fn for_job(model: &ModelSpec, splits: &Splits) -> Mlp {
        let hidden: Vec<usize> = model.hidden_sizes.iter().map(|&h| h as usize).collect();
        Mlp::new(splits.train.dim, &hidden, splits.classes)
    }

    pub fn new(input: usize, hidden: &[usize], classes: usize) -> Mlp {
        let mut sizes = vec![input];
        sizes.extend_from_slice(hidden);
        sizes.push(classes);
        Mlp {
            sizes,
            kernels: KernelPlan::fixed(),
        }
    }

    /// The model computing its products with `kernels`.
    pub fn with_kernels(self, kernels: KernelPlan) -> Mlp {
        Mlp { kernels, ..self }
    }

    pub fn kernels(&self) -> &KernelPlan {
        &self.kernels
    }

    /// Layer `l`'s forward product `Z = A · W` on `rows` rows.
    fn forward_product(&self, l: usize, rows: usize) -> Product {
        Product::plain(rows, self.sizes[l], self.sizes[l + 1])
    }

    /// Layer `l`'s weight gradient `dW = Aᵀ · dZ` on `rows` rows (the activations read transposed).
    fn weight_grad_product(&self, l: usize, rows: usize) -> Product {
        Product {
            a_transposed: true,
            ..Product::plain(self.sizes[l], rows, self.sizes[l + 1])
        }
    }

    /// Layer `l`'s input gradient `dA = dZ · Wᵀ` on `rows` rows (the weights read transposed).
    fn input_grad_product(&self, l: usize, rows: usize) -> Product {
        Product {
            b_transposed: true,
            ..Product::plain(rows, self.sizes[l + 1], self.sizes[l])
        }
    }

    /// The products one forward and backward pass on `rows` rows makes: per layer the forward product, the
    /// weight gradient and, except for the first layer, the input gradient.
    pub fn step_products(&self, rows: usize) -> Vec<Product> {
        let mut products = Vec::new();
        for l in 0..self.sizes.len() - 1 {
            products.push(self.forward_product(l, rows));
            products.push(self.weight_grad_product(l, rows));
            if l > 0 {
                products.push(self.input_grad_product(l, rows));
            }
        }
        products
    }

    /// The products of a step of `batch` rows split over `threads` compute threads, as
    /// [`Mlp::batch_grad_bucketed`] splits it.
    pub fn batch_products(&self, batch: usize, threads: usize) -> Vec<Product> {
        let parts = threads.clamp(1, batch.max(1));
        let per = batch.div_ceil(parts);
        let mut rows: Vec<usize> = (0..parts)
            .map(|p| ((p + 1) * per).min(batch) - (p * per).min(batch))
            .filter(|&r| r > 0)
            .collect();
        rows.dedup();
        rows.iter().flat_map(|&r| self.step_products(r)).collect()
    }

    pub fn input_size(&self) -> usize {
        self.sizes[0]
    }

    pub fn classes(&self) -> usize {
        self.sizes[self.sizes.len() - 1]
    }

    /// Layer widths, input first.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    pub fn param_count(&self) -> usize {
        self.sizes.windows(2).map(|w| w[0] * w[1] + w[1]).sum()
    }

    /// He-normal weights and zero biases, the same on every rank for the same seed.
    pub fn init(&self, seed: u64) -> Vec<f32> {
        let mut rng = Rng::derive(seed, INIT_STREAM);
        let mut params = Vec::with_capacity(self.param_count());
        for w in self.sizes.windows(2) {
            let std = (2.0 / w[0] as f64).sqrt();
            params.extend((0..w[0] * w[1]).map(|_| (rng.normal() * std) as f32));
            params.extend(std::iter::repeat_n(0.0f32, w[1]));
        }
        params
    }

    /// Offsets of (weights, bias) of every layer in the flat buffer.
    fn layout(&self) -> Vec<(usize, usize)> {
        let mut offset = 0;
        self.sizes
            .windows(2)
            .map(|w| {
                let weights = offset;
                offset += w[0] * w[1];
                let bias = offset;
                offset += w[1];
                (weights, bias)
            })
            .collect()
    }

    /// Forward pass of `x` (rows of `input_size`); returns every layer's output: the hidden layers' after their
    /// ReLU (what the next layer reads; its sign is the ReLU's mask in backward), the last layer's logits. The
    /// bias and the ReLU are one pass over the product's output.
    fn forward(&self, params: &[f32], x: &[f32], rows: usize) -> Vec<Vec<f32>> {
        let layout = self.layout();
        let last = layout.len() - 1;
        let mut outputs: Vec<Vec<f32>> = Vec::with_capacity(layout.len());
        for (l, &(w_off, b_off)) in layout.iter().enumerate() {
            let (n_in, n_out) = (self.sizes[l], self.sizes[l + 1]);
            let a: &[f32] = if l == 0 { x } else { &outputs[l - 1] };
            let mut z = vec![0.0f32; rows * n_out];
            let weights = &params[w_off..w_off + n_in * n_out];
            self.kernels
                .gemm(self.forward_product(l, rows), a, weights, 0.0, &mut z);
            let bias = &params[b_off..b_off + n_out];
            for row in z.chunks_exact_mut(n_out) {
                if l == last {
                    for (v, b) in row.iter_mut().zip(bias) {
                        *v += b;
                    }
                } else {
                    for (v, b) in row.iter_mut().zip(bias) {
                        *v = (*v + b).max(0.0);
                    }
                }
            }
            outputs.push(z);
        }
        outputs
    }

    /// Loss and accuracy of `x`/`y` without gradients.
    pub fn evaluate(&self, params: &[f32], x: &[f32], y: &[u32]) -> BatchStats {
        if y.is_empty() {
            return BatchStats::default();
        }
        let outputs = self.forward(params, x, y.len());
        let logits = outputs.last().map(Vec::as_slice).unwrap_or_default();
        softmax_stats(logits, y, self.classes(), None)
    }

    /// Elements of every layer (weights then bias) in the flat buffer, layer 0 first, back to back.
    pub fn layer_elems(&self) -> Vec<usize> {
        self.sizes.windows(2).map(|w| w[0] * w[1] + w[1]).collect()
    }

    /// `buf` (one flat parameter-sized buffer) split into one disjoint slice per layer.
    fn layer_slices<'g>(&self, mut buf: &'g mut [f32]) -> Vec<&'g mut [f32]> {
        let mut slices = Vec::with_capacity(self.sizes.len() - 1);
        for n in self.layer_elems() {
            let (layer, rest) = std::mem::take(&mut buf).split_at_mut(n);
            slices.push(layer);
            buf = rest;
        }
        slices
    }

    /// Writes `scale ×` the gradient of the summed loss of `x`/`y` over `grads` (one slice per
    /// layer, see [`Mlp::layer_slices`]; no need to zero them first) and hands each layer's slice to `done` as soon as backward has
    /// finished it, the last layer first; returns the batch's stats.
    fn backward<'g>(
        &self,
        params: &[f32],
        (x, y): (&[f32], &[u32]),
        scale: f32,
        grads: Vec<&'g mut [f32]>,
        mut done: impl FnMut(usize, &'g mut [f32]),
    ) -> BatchStats {
        let rows = y.len();
        if rows == 0 {
            for (l, g) in grads.into_iter().enumerate().rev() {
                g.fill(0.0);
                done(l, g);
            }
            return BatchStats::default();
        }
        let layout = self.layout();
        let outputs = self.forward(params, x, rows);
        let last = layout.len() - 1;
        let mut dz = vec![0.0f32; rows * self.classes()];
        let stats = softmax_stats(&outputs[last], y, self.classes(), Some((&mut dz, scale)));
        for (l, grad) in (0..layout.len()).rev().zip(grads.into_iter().rev()) {
            let (w_off, _) = layout[l];
            let (n_in, n_out) = (self.sizes[l], self.sizes[l + 1]);
            let a: &[f32] = if l == 0 { x } else { &outputs[l - 1] };
            let (dw, db) = grad.split_at_mut(n_in * n_out);
            // dW = Aᵀ · dZ (written over: no pass to zero the gradient first)
            self.kernels
                .gemm(self.weight_grad_product(l, rows), a, &dz, 0.0, dw);
            db.fill(0.0);
            for row in dz.chunks_exact(n_out) {
                for (g, d) in db.iter_mut().zip(row) {
                    *g += d;
                }
            }
            done(l, grad);
            if l == 0 {
                break;
            }
            // dA = dZ · Wᵀ, then through the ReLU of the layer below.
            let mut da = vec![0.0f32; rows * n_in];
            let weights = &params[w_off..w_off + n_in * n_out];
            self.kernels
                .gemm(self.input_grad_product(l, rows), &dz, weights, 0.0, &mut da);
            // The ReLU let through only what its output kept positive.
            for (d, &activation) in da.iter_mut().zip(&outputs[l - 1]) {
                if activation <= 0.0 {
                    *d = 0.0;
                }
            }
            dz = da;
        }
        stats
    }

    /// The gradient of the mean loss of the batch into `grad` (overwritten), the rows split in
    /// contiguous parts over `threads` compute threads and summed in a fixed order.
    pub fn batch_grad(
        &self,
        params: &[f32],
        x: &[f32],
        y: &[u32],
        threads: usize,
        grad: &mut [f32],
    ) -> BatchStats {
        self.batch_grad_bucketed(params, (x, y), threads, usize::MAX, grad, |_, _| {})
    }

    /// [`Mlp::batch_grad`] that hands over the gradient in buckets of at most `cap_bytes` (see
    /// [`buckets::partition`]): `ready(bucket, pieces)` is called, in bucket order, as soon as every
    /// compute thread has finished the bucket's layers, while backward continues on the earlier
    /// layers; `pieces` concatenated are `grad[bucket.range]`. With several threads each part's
    /// gradient goes to its own buffer and the parts are summed in part order, as `batch_grad`
    /// always did, so the result is bitwise the same for every `cap_bytes`.
    pub fn batch_grad_bucketed(
        &self,
        params: &[f32],
        (x, y): (&[f32], &[u32]),
        threads: usize,
        cap_bytes: usize,
        grad: &mut [f32],
        mut ready: impl FnMut(&Bucket, &[&[f32]]),
    ) -> BatchStats {
        let layer_elems = self.layer_elems();
        let buckets = buckets::partition(&layer_elems, cap_bytes);
        let rows = y.len();
        if rows == 0 {
            grad.fill(0.0);
            for bucket in &buckets {
                ready(bucket, &[&grad[bucket.range.clone()]]);
            }
            return BatchStats::default();
        }
        let scale = 1.0 / rows as f32;
        let parts = threads.clamp(1, rows);
        if parts == 1 {
            // One thread: straight into `grad`, each bucket handed over from inside backward.
            let mut got: Vec<Option<&[f32]>> = vec![None; layer_elems.len()];
            let mut pending = buckets.iter().peekable();
            let slices = self.layer_slices(grad);
            return self.backward(params, (x, y), scale, slices, |l, g| {
                got[l] = Some(g);
                while let Some(bucket) =
                    pending.next_if(|b| b.layers.clone().all(|l| got[l].is_some()))
                {
                    let pieces: Vec<&[f32]> = got[bucket.layers.clone()]
                        .iter()
                        .flatten()
                        .copied()
                        .collect();
                    ready(bucket, &pieces);
                }
            });
        }
        let per = rows.div_ceil(parts);
        let dim = self.input_size();
        let range = |p: usize| ((p * per).min(rows), ((p + 1) * per).min(rows));
        let mut layer_starts = Vec::with_capacity(layer_elems.len());
        layer_elems.iter().fold(0, |start, n| {
            layer_starts.push(start);
            start + n
        });
        let mut part_grads = vec![vec![0.0f32; params.len()]; parts];
        std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::channel::<(usize, usize, &[f32])>();
            let handles: Vec<_> = part_grads
                .iter_mut()
                .enumerate()
                .map(|(p, g)| {
                    let (lo, hi) = range(p);
                    let batch = (&x[lo * dim..hi * dim], &y[lo..hi]);
                    let slices = self.layer_slices(g);
                    let tx = tx.clone();
                    s.spawn(move || {
                        self.backward(params, batch, scale, slices, |l, g| {
                            // The receiver only goes away when this scope is unwinding.
                            let _ = tx.send((p, l, g));
                        })
                    })
                })
                .collect();
            drop(tx);
            // got[layer][part]: that part's finished gradient of that layer.
            let mut got: Vec<Vec<Option<&[f32]>>> = vec![vec![None; parts]; layer_elems.len()];
            'buckets: for bucket in &buckets {
                while !bucket
                    .layers
                    .clone()
                    .all(|l| got[l].iter().all(Option::is_some))
                {
                    match rx.recv() {
                        Ok((p, l, g)) => got[l][p] = Some(g),
                        // A compute thread panicked: joining it below re-raises the panic.
                        Err(_) => break 'buckets,
                    }
                }
                for l in bucket.layers.clone() {
                    let dst = &mut grad[layer_starts[l]..layer_starts[l] + layer_elems[l]];
                    for (p, src) in got[l].iter().flatten().enumerate() {
                        if p == 0 {
                            dst.copy_from_slice(src);
                        } else {
                            for (a, b) in dst.iter_mut().zip(src.iter()) {
                                *a += b;
                            }
                        }
                    }
                }
                ready(bucket, &[&grad[bucket.range.clone()]]);
            }
            let mut stats = BatchStats::default();
            for h in handles {
                let st = h.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
                stats.add(st);
            }
            stats
        })
    }
}

/// Cross-entropy and correct predictions of `logits`; with `grad`, writes `scale × (softmax − onehot)`.
fn softmax_stats(
    logits: &[f32],
    y: &[u32],
    classes: usize,
    mut grad: Option<(&mut [f32], f32)>,
) -> BatchStats {
    let mut stats = BatchStats {
        samples: y.len() as u64,
        ..BatchStats::default()
    };
    for (i, (row, &label)) in logits.chunks_exact(classes).zip(y).enumerate() {
        let label = label as usize;
        let (mut best, mut max) = (0, f32::NEG_INFINITY);
        for (c, &v) in row.iter().enumerate() {
            if v > max {
                (best, max) = (c, v);
            }
        }
        let sum: f64 = row.iter().map(|&v| ((v - max) as f64).exp()).sum();
        stats.loss_sum += sum.ln() - (row[label] - max) as f64;
        stats.correct += u64::from(best == label);
        if let Some((g, scale)) = grad.as_mut() {
            let out = &mut g[i * classes..(i + 1) * classes];
            for (c, (o, &v)) in out.iter_mut().zip(row).enumerate() {
                let p = (((v - max) as f64).exp() / sum) as f32;
                *o = *scale * (p - f32::from(u8::from(c == label)));
            }
        }
    }
    stats
}

/// FNV-1a over the parameters' f32 bits: equal on ranks whose parameters are bitwise equal.
pub(crate) fn checksum(params: &[f32]) -> u64 {
    params.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
        v.to_bits().to_le_bytes().iter().fold(h, |h, &b| {
            (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Kernel;

    fn sample_batch(model: &Mlp, rows: usize, seed: u64) -> (Vec<f32>, Vec<u32>) {
        let mut rng = Rng::new(seed);
        let x = (0..rows * model.input_size())
            .map(|_| rng.normal() as f32)
            .collect();
        let y = (0..rows)
            .map(|_| rng.below(model.classes()) as u32)
            .collect();
        (x, y)
    }

    #[test]
    fn gradient_matches_central_finite_differences() {
        for hidden in [vec![], vec![7], vec![7, 6]] {
            check_gradient(&Mlp::new(5, &hidden, 4));
        }
    }

    fn check_gradient(model: &Mlp) {
        let params = model.init(3);
        let (x, y) = sample_batch(model, 9, 5);
        let mut grad = vec![0.0; params.len()];
        model.batch_grad(&params, &x, &y, 1, &mut grad);
        let loss = |p: &[f32]| -> f64 {
            let s = model.evaluate(p, &x, &y);
            s.mean_loss()
        };
        let eps = 1e-3f32;
        let mut checked = 0;
        for i in (0..params.len()).step_by(3) {
            let mut plus = params.clone();
            plus[i] += eps;
            let mut minus = params.clone();
            minus[i] -= eps;
            let numeric = (loss(&plus) - loss(&minus)) / (2.0 * eps as f64);
            let analytic = grad[i] as f64;
            let tol = 2e-3 + 2e-2 * numeric.abs().max(analytic.abs());
            assert!(
                (numeric - analytic).abs() <= tol,
                "{:?} param {i}: numeric {numeric} analytic {analytic}",
                model.sizes()
            );
            checked += 1;
        }
        assert!(checked >= 8);
        assert!(grad.iter().any(|g| g.abs() > 1e-3));
    }

    #[test]
    fn the_gradient_is_written_over_whatever_the_buffer_held() {
        let model = Mlp::new(8, &[16, 6], 3);
        let params = model.init(2);
        let (x, y) = sample_batch(&model, 10, 9);
        for threads in [1, 3] {
            let mut zeroed = vec![0.0; params.len()];
            model.batch_grad(&params, &x, &y, threads, &mut zeroed);
            let mut stale = vec![1.0e6; params.len()];
            model.batch_grad(&params, &x, &y, threads, &mut stale);
            let bits = |v: &[f32]| v.iter().map(|g| g.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&stale), bits(&zeroed), "{threads} thread(s)");
        }
    }

    #[test]
    fn split_over_threads_gives_the_same_gradient() {
        let model = Mlp::new(8, &[16], 3);
        let params = model.init(1);
        let (x, y) = sample_batch(&model, 21, 2);
        let mut one = vec![0.0; params.len()];
        let mut four = vec![0.0; params.len()];
        let s1 = model.batch_grad(&params, &x, &y, 1, &mut one);
        let s4 = model.batch_grad(&params, &x, &y, 4, &mut four);
        assert_eq!(s1.samples, s4.samples);
        assert_eq!(s1.correct, s4.correct);
        for (a, b) in one.iter().zip(&four) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    #[test]
    fn buckets_give_bitwise_the_same_gradient_and_arrive_last_layer_first() {
        let model = Mlp::new(12, &[20, 16], 5);
        let params = model.init(4);
        let (x, y) = sample_batch(&model, 23, 6);
        for threads in [1, 3] {
            let mut whole = vec![0.0; params.len()];
            let s1 = model.batch_grad(&params, &x, &y, threads, &mut whole);
            // 12-20-16-5: layers of 260, 336 and 85 elements; a 400-byte cap splits every one.
            for cap in [400, 1400, 2400, usize::MAX] {
                let mut grad = vec![f32::NAN; params.len()];
                let mut handed = vec![f32::NAN; params.len()];
                let mut order = Vec::new();
                let s2 = model.batch_grad_bucketed(
                    &params,
                    (&x, &y),
                    threads,
                    cap,
                    &mut grad,
                    |bucket, g| {
                        order.push(bucket.layers.clone());
                        handed[bucket.range.clone()].copy_from_slice(&g.concat());
                    },
                );
                assert_eq!(s1, s2);
                assert_eq!(checksum(&whole), checksum(&grad), "cap {cap}");
                assert_eq!(checksum(&whole), checksum(&handed), "cap {cap}");
                let expected = buckets::partition(&model.layer_elems(), cap);
                assert_eq!(
                    order,
                    expected
                        .iter()
                        .map(|b| b.layers.clone())
                        .collect::<Vec<_>>()
                );
            }
        }
        assert_eq!(
            buckets::partition(&model.layer_elems(), 400).len(),
            3,
            "the test must cover several buckets"
        );
    }

    #[test]
    fn an_empty_batch_hands_over_zero_buckets() {
        let model = Mlp::new(4, &[3], 2);
        let mut grad = vec![1.0; model.param_count()];
        let mut calls = 0;
        let stats = model.batch_grad_bucketed(&[0.0; 29], (&[], &[]), 2, 16, &mut grad, |_, g| {
            calls += 1;
            assert!(g.concat().iter().all(|&v| v == 0.0));
        });
        assert_eq!(stats.samples, 0);
        assert_eq!(calls, 2);
        assert!(grad.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn the_plans_kernel_computes_every_product_of_a_step_to_the_same_gradient_up_to_rounding() {
        let model = Mlp::new(700, &[80, 40], 10);
        let params = model.init(3);
        let (x, y) = sample_batch(&model, 33, 5);
        let gradient = |model: &Mlp| {
            let mut grad = vec![0.0; params.len()];
            model.batch_grad(&params, &x, &y, 1, &mut grad);
            grad
        };
        let fixed = gradient(&model);
        let gemm_plan = KernelPlan::only(Kernel::GemmCrate, &model.step_products(33));
        let other = gradient(&model.clone().with_kernels(gemm_plan));
        let worst = fixed
            .iter()
            .zip(&other)
            .map(|(a, b)| (a - b).abs() / a.abs().max(1e-3))
            .fold(0f32, f32::max);
        assert!(worst < 1e-3, "relative difference {worst}");
        // With 700 inputs the first product's sum is longer than matrixmultiply's depth block (256): the two
        // kernels split it differently, so bitwise the same gradient would mean the plan was not used.
        assert_ne!(
            checksum(&fixed),
            checksum(&other),
            "the gemm crate's plan was ignored"
        );
    }

    #[test]
    fn init_is_deterministic_and_sized() {
        let model = Mlp::new(64, &[32], 10);
        assert_eq!(model.param_count(), 64 * 32 + 32 + 32 * 10 + 10);
        assert_eq!(model.init(9), model.init(9));
        assert_ne!(model.init(9), model.init(10));
        assert_eq!(checksum(&model.init(9)), checksum(&model.init(9)));
        assert_ne!(checksum(&model.init(9)), checksum(&model.init(10)));
    }

    #[test]
    fn a_perfect_prediction_has_near_zero_loss() {
        let logits = [10.0f32, -10.0, -10.0, 10.0];
        let s = softmax_stats(&logits, &[0, 1], 2, None);
        assert_eq!(s.correct, 2);
        assert!(s.mean_loss() < 1e-6);
    }
}
