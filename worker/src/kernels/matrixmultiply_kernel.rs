//! matrixmultiply's sgemm: the default kernel, with the same bits on every run.

use super::{Product, Strides};

/// `c = a · b + beta × c`.
///
/// # Safety
/// With `strides`, `a`, `b` and `c` must hold every element of their `p.m × p.k`, `p.k × p.n` and `p.m × p.n`
/// matrices (`c` row-major with row stride `p.n`).
pub(super) unsafe fn sgemm(
    p: Product,
    ((rsa, csa), (rsb, csb)): Strides,
    a: &[f32],
    b: &[f32],
    beta: f32,
    c: &mut [f32],
) {
    // SAFETY: the caller guarantees every element sgemm reads or writes is inside its slice.
    unsafe {
        matrixmultiply::sgemm(
            p.m,
            p.k,
            p.n,
            1.0,
            a.as_ptr(),
            rsa as isize,
            csa as isize,
            b.as_ptr(),
            rsb as isize,
            csb as isize,
            beta,
            c.as_mut_ptr(),
            p.n as isize,
            1,
        );
    }
}
