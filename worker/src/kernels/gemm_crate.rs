//! The `gemm` crate's sgemm (its own packing and micro-kernels per instruction set), single-threaded: a rank's
//! parallelism is its tiles.

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
    // SAFETY: the caller guarantees every element gemm reads or writes is inside its slice. gemm computes
    // dst := alpha·dst + beta·lhs·rhs, reading dst only when read_dst is set: its alpha is our beta.
    unsafe {
        gemm::gemm(
            p.m,
            p.n,
            p.k,
            c.as_mut_ptr(),
            1,
            p.n as isize,
            beta != 0.0,
            a.as_ptr(),
            csa as isize,
            rsa as isize,
            b.as_ptr(),
            csb as isize,
            rsb as isize,
            beta,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}
