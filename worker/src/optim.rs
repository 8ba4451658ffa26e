//! Optimizers over the flat parameter buffer: SGD with momentum (PyTorch's form) and Adam.

use rdu_crds::OptimizerName;

/// Optimizer state; the same on every rank because every rank applies the same averaged gradient.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Optimizer {
    /// v = μ·v + g; p -= lr·v
    Sgd {
        lr: f32,
        momentum: f32,
        velocity: Vec<f32>,
    },
    /// Adam (β1 0.9, β2 0.999, ε 1e-8) with bias correction.
    Adam {
        lr: f32,
        m: Vec<f32>,
        v: Vec<f32>,
        t: u64,
    },
}

const BETA1: f32 = 0.9;
const BETA2: f32 = 0.999;
const EPSILON: f32 = 1e-8;

impl Optimizer {
    pub(crate) fn new(name: OptimizerName, lr: f64, momentum: f64, params: usize) -> Optimizer {
        match name {
            OptimizerName::Sgd => Optimizer::Sgd {
                lr: lr as f32,
                momentum: momentum as f32,
                velocity: vec![0.0; params],
            },
            OptimizerName::Adam => Optimizer::Adam {
                lr: lr as f32,
                m: vec![0.0; params],
                v: vec![0.0; params],
                t: 0,
            },
        }
    }

    /// Applies one step of the mean gradient to `params`, given the gradient summed over `ranks`
    /// ranks: the mean is taken here, in the pass the step makes over the gradient anyway, rather
    /// than in a pass of its own. On 2^k ranks it multiplies by 1/n, which is exactly x/n there;
    /// otherwise it divides.
    pub(crate) fn step(&mut self, params: &mut [f32], grad_sum: &[f32], ranks: u32) {
        if ranks.is_power_of_two() {
            let inverse = 1.0 / ranks as f32;
            self.step_with(params, grad_sum, |g| g * inverse);
        } else {
            let n = ranks as f32;
            self.step_with(params, grad_sum, |g| g / n);
        }
    }

    fn step_with(&mut self, params: &mut [f32], grad_sum: &[f32], mean: impl Fn(f32) -> f32) {
        match self {
            Optimizer::Sgd {
                lr,
                momentum,
                velocity,
            } => {
                for ((p, g), v) in params.iter_mut().zip(grad_sum).zip(velocity.iter_mut()) {
                    *v = *momentum * *v + mean(*g);
                    *p -= *lr * *v;
                }
            }
            Optimizer::Adam { lr, m, v, t } => {
                *t += 1;
                let c1 = 1.0 - BETA1.powi(*t as i32);
                let c2 = 1.0 - BETA2.powi(*t as i32);
                for (((p, g), m), v) in params
                    .iter_mut()
                    .zip(grad_sum)
                    .zip(m.iter_mut())
                    .zip(v.iter_mut())
                {
                    let g = mean(*g);
                    *m = BETA1 * *m + (1.0 - BETA1) * g;
                    *v = BETA2 * *v + (1.0 - BETA2) * g * g;
                    *p -= *lr * (*m / c1) / ((*v / c2).sqrt() + EPSILON);
                }
            }
        }
    }

    /// The state vectors, for checkpoints.
    pub(crate) fn state(&self) -> Vec<&[f32]> {
        match self {
            Optimizer::Sgd { velocity, .. } => vec![velocity],
            Optimizer::Adam { m, v, .. } => vec![m, v],
        }
    }

    /// Restores the state written by [`Optimizer::state`] after `steps` steps.
    pub(crate) fn restore(&mut self, state: &[Vec<f32>], steps: u64) -> bool {
        match self {
            Optimizer::Sgd { velocity, .. } => match state {
                [v] if v.len() == velocity.len() => {
                    velocity.clone_from(v);
                    true
                }
                _ => false,
            },
            Optimizer::Adam { m, v, t, .. } => match state {
                [sm, sv] if sm.len() == m.len() && sv.len() == v.len() => {
                    m.clone_from(sm);
                    v.clone_from(sv);
                    *t = steps;
                    true
                }
                _ => false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sgd_with_momentum_matches_hand_computed_steps() {
        let mut opt = Optimizer::new(OptimizerName::Sgd, 0.1, 0.9, 1);
        let mut p = [1.0f32];
        opt.step(&mut p, &[0.5], 1); // v = 0.5, p = 1 - 0.05
        assert!((p[0] - 0.95).abs() < 1e-7);
        opt.step(&mut p, &[0.5], 1); // v = 0.45 + 0.5 = 0.95, p = 0.95 - 0.095
        assert!((p[0] - 0.855).abs() < 1e-6);
    }

    #[test]
    fn adam_matches_hand_computed_steps() {
        let mut opt = Optimizer::new(OptimizerName::Adam, 0.01, 0.0, 1);
        let mut p = [1.0f32];
        // Step 1: m̂ = g, v̂ = g², update = lr · g/|g| = 0.01.
        opt.step(&mut p, &[2.0], 1);
        assert!((p[0] - 0.99).abs() < 1e-6, "{}", p[0]);
        // Step 2 with g = 0: m = 0.18, v = 0.003996; m̂ = 0.18/0.19, v̂ = 0.003996/0.001999.
        opt.step(&mut p, &[0.0], 1);
        let m_hat = 0.18f64 / 0.19;
        let v_hat = 0.003996f64 / (1.0 - 0.999f64.powi(2));
        let expected = 0.99 - 0.01 * m_hat / (v_hat.sqrt() + 1e-8);
        assert!(
            (p[0] as f64 - expected).abs() < 1e-5,
            "{} vs {expected}",
            p[0]
        );
    }

    #[test]
    fn a_sum_over_ranks_steps_exactly_as_its_mean_would() {
        // Sums of values that are not multiples of the world size, over 1 to 6 ranks.
        let sums: Vec<f32> = (0..5000).map(|i| (i as f32 * 0.377).sin() * 3.3).collect();
        for ranks in 1..=6u32 {
            for name in [OptimizerName::Sgd, OptimizerName::Adam] {
                let mean: Vec<f32> = sums.iter().map(|s| s / ranks as f32).collect();
                let (mut from_sum, mut from_mean) = (
                    Optimizer::new(name, 0.1, 0.9, sums.len()),
                    Optimizer::new(name, 0.1, 0.9, sums.len()),
                );
                let (mut p, mut q) = (vec![1.0f32; sums.len()], vec![1.0f32; sums.len()]);
                for _ in 0..3 {
                    from_sum.step(&mut p, &sums, ranks);
                    from_mean.step(&mut q, &mean, 1);
                }
                assert_eq!(p, q, "{ranks} ranks, {name:?}");
                assert_eq!(from_sum, from_mean);
            }
        }
    }

    #[test]
    fn state_round_trips() {
        let mut a = Optimizer::new(OptimizerName::Adam, 0.01, 0.0, 2);
        let mut p = [1.0f32, 2.0];
        a.step(&mut p, &[0.1, -0.2], 1);
        let state: Vec<Vec<f32>> = a.state().into_iter().map(<[f32]>::to_vec).collect();
        let mut b = Optimizer::new(OptimizerName::Adam, 0.01, 0.0, 2);
        assert!(b.restore(&state, 1));
        assert_eq!(a, b);
        assert!(!b.restore(&state[..1], 1));
    }
}
