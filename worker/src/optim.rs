//! Optimizers over the flat parameter buffer: SGD with momentum (PyTorch's form) and Adam.

use rdu_crds::OptimizerName;

/// Optimizer state; the same on every rank because every rank applies the same averaged gradient.
#[derive(Debug, Clone, PartialEq)]
pub enum Optimizer {
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
    pub fn new(name: OptimizerName, lr: f64, momentum: f64, params: usize) -> Optimizer {
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

    /// Applies one step of `grad` to `params`.
    pub fn step(&mut self, params: &mut [f32], grad: &[f32]) {
        match self {
            Optimizer::Sgd {
                lr,
                momentum,
                velocity,
            } => {
                for ((p, g), v) in params.iter_mut().zip(grad).zip(velocity.iter_mut()) {
                    *v = *momentum * *v + g;
                    *p -= *lr * *v;
                }
            }
            Optimizer::Adam { lr, m, v, t } => {
                *t += 1;
                let c1 = 1.0 - BETA1.powi(*t as i32);
                let c2 = 1.0 - BETA2.powi(*t as i32);
                for (((p, g), m), v) in params
                    .iter_mut()
                    .zip(grad)
                    .zip(m.iter_mut())
                    .zip(v.iter_mut())
                {
                    *m = BETA1 * *m + (1.0 - BETA1) * g;
                    *v = BETA2 * *v + (1.0 - BETA2) * g * g;
                    *p -= *lr * (*m / c1) / ((*v / c2).sqrt() + EPSILON);
                }
            }
        }
    }

    /// The state vectors, for checkpoints.
    pub fn state(&self) -> Vec<&[f32]> {
        match self {
            Optimizer::Sgd { velocity, .. } => vec![velocity],
            Optimizer::Adam { m, v, .. } => vec![m, v],
        }
    }

    /// Restores the state written by [`Optimizer::state`] after `steps` steps.
    pub fn restore(&mut self, state: &[Vec<f32>], steps: u64) -> bool {
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
        opt.step(&mut p, &[0.5]); // v = 0.5, p = 1 - 0.05
        assert!((p[0] - 0.95).abs() < 1e-7);
        opt.step(&mut p, &[0.5]); // v = 0.45 + 0.5 = 0.95, p = 0.95 - 0.095
        assert!((p[0] - 0.855).abs() < 1e-6);
    }

    #[test]
    fn adam_matches_hand_computed_steps() {
        let mut opt = Optimizer::new(OptimizerName::Adam, 0.01, 0.0, 1);
        let mut p = [1.0f32];
        // Step 1: m̂ = g, v̂ = g², update = lr · g/|g| = 0.01.
        opt.step(&mut p, &[2.0]);
        assert!((p[0] - 0.99).abs() < 1e-6, "{}", p[0]);
        // Step 2 with g = 0: m = 0.18, v = 0.003996; m̂ = 0.18/0.19, v̂ = 0.003996/0.001999.
        opt.step(&mut p, &[0.0]);
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
    fn state_round_trips() {
        let mut a = Optimizer::new(OptimizerName::Adam, 0.01, 0.0, 2);
        let mut p = [1.0f32, 2.0];
        a.step(&mut p, &[0.1, -0.2]);
        let state: Vec<Vec<f32>> = a.state().into_iter().map(<[f32]>::to_vec).collect();
        let mut b = Optimizer::new(OptimizerName::Adam, 0.01, 0.0, 2);
        assert!(b.restore(&state, 1));
        assert_eq!(a, b);
        assert!(!b.restore(&state[..1], 1));
    }
}
