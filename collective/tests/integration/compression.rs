//! Compressed all-reduce (bf16, fp16): every rank bitwise identical after every call, for 1 to 5
//! ranks and every algorithm, close to the exact sum, exact on values the wire represents, and a
//! rank compressing differently from its peers is a protocol error, not a hang or a wrong sum.

use std::time::Duration;

use crate::common::{assert_bitwise_identical, data, reduce_in_place, world, world_on};
use futures::future::join_all;
use rdu_collective::{
    Algorithm, CollectiveError, Communicator, Compression, DataPath, ReduceOptions,
};

const TIMEOUT: Duration = Duration::from_secs(20);
const SIZES: [usize; 4] = [1, 7, 1000, 600_001];
const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::Ring,
    Algorithm::Star,
    Algorithm::Hierarchical,
    Algorithm::Auto,
];

/// Each value is rounded to 16 bits once per hop it travels (at most `world` hops to the
/// reducing rank, and once more for the way back), each time by at most `epsilon` of the
/// magnitudes summed so far.
fn assert_close(bufs: &[Vec<f32>], compression: Compression, what: &str) {
    let world = bufs.len() as u32;
    let epsilon = match compression {
        Compression::Bf16 => 2f64.powi(-8),
        Compression::Fp16 => 2f64.powi(-11),
        Compression::None => 0.0,
    };
    let len = bufs[0].len();
    let mut exact = vec![0f64; len];
    let mut magnitude = vec![0f64; len];
    for r in 0..world {
        for (i, v) in data(r, len).into_iter().enumerate() {
            exact[i] += f64::from(v);
            magnitude[i] += f64::from(v.abs());
        }
    }
    for i in 0..len {
        let error = (f64::from(bufs[0][i]) - exact[i]).abs();
        let bound = f64::from(world + 1) * epsilon * magnitude[i] + 1e-6;
        assert!(
            error <= bound,
            "{what}: element {i} is {}, exact {}, error {error} > {bound}",
            bufs[0][i],
            exact[i]
        );
    }
}

async fn check_world(n: u32, node_of: impl Fn(u32) -> String) {
    let comms = world(n, node_of, TIMEOUT).await;
    for compression in [Compression::Bf16, Compression::Fp16] {
        for algorithm in ALGORITHMS {
            for len in SIZES {
                let mut bufs: Vec<Vec<f32>> = (0..n).map(|r| data(r, len)).collect();
                let options = ReduceOptions {
                    algorithm,
                    compression,
                };
                reduce_in_place(&comms, &mut bufs, options).await;
                let what = format!("{n} ranks {algorithm} {compression} len {len}");
                assert_bitwise_identical(&bufs, &what);
                assert_close(&bufs, compression, &what);
            }
        }
    }
    join_all(comms.into_iter().map(Communicator::shutdown)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_rank() {
    check_world(1, |_| "n".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ranks() {
    check_world(2, |r| format!("n{r}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_ranks_on_two_nodes() {
    check_world(3, |r| format!("n{}", r % 2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_ranks() {
    check_world(4, |r| format!("n{}", r / 2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_ranks() {
    check_world(5, |r| format!("n{r}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_the_wire_represents_sum_exactly_and_repeated_steps_stay_identical() {
    // Small integers are exact in bf16 and fp16, and so are their sums here.
    let comms = world_on(3, |r| format!("n{r}"), TIMEOUT, |_| DataPath::Grpc).await;
    for compression in [Compression::Bf16, Compression::Fp16] {
        let options = ReduceOptions {
            algorithm: Algorithm::Ring,
            compression,
        };
        let mut bufs: Vec<Vec<f32>> = (0..3)
            .map(|r| (0..1001).map(|i| ((i % 17) + r) as f32).collect())
            .collect();
        reduce_in_place(&comms, &mut bufs, options).await;
        let expected: Vec<f32> = (0..1001).map(|i| (3 * (i % 17) + 3) as f32).collect();
        for b in &bufs {
            assert_eq!(b, &expected, "{compression}");
        }
        // Training repeats the call on the result: ranks stay identical step after step.
        let mut steps: Vec<Vec<f32>> = (0..3).map(|r| data(r, 5000)).collect();
        for step in 0..5 {
            reduce_in_place(&comms, &mut steps, options).await;
            assert_bitwise_identical(&steps, &format!("{compression} step {step}"));
            for s in &mut steps {
                s.iter_mut().for_each(|v| *v *= 0.37);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_that_compress_differently_get_a_protocol_error() {
    let comms = world(2, |_| "n".into(), TIMEOUT).await;
    let mut a = vec![1.0f32; 1000];
    let mut b = vec![1.0f32; 1000];
    let bf16 = ReduceOptions {
        algorithm: Algorithm::Ring,
        compression: Compression::Bf16,
    };
    let (ra, rb) = tokio::join!(
        comms[0].all_reduce_sum(&mut a, bf16),
        comms[1].all_reduce_sum(&mut b, Algorithm::Ring)
    );
    let protocol = |r: &Result<(), CollectiveError>| matches!(r, Err(CollectiveError::Protocol { reason, .. }) if reason.contains("compression"));
    assert!(protocol(&ra) || protocol(&rb), "{ra:?} {rb:?}");
}

#[test]
fn compressions_parse_and_print() {
    for c in [Compression::None, Compression::Bf16, Compression::Fp16] {
        assert_eq!(c.to_string().parse::<Compression>().ok(), Some(c));
    }
    let error = "int8".parse::<Compression>().unwrap_err().to_string();
    assert!(
        error.contains("compression") && error.contains("bf16"),
        "{error}"
    );
    assert_eq!(Compression::Bf16.bytes_per_value(), 2);
    assert_eq!(Compression::None.bytes_per_value(), 4);
}
