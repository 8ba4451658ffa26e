//! The second baseline: a blocking TCP ping-pong between this process and a child on loopback, the same bytes each
//! way, as small all-reduces are judged against (a 2-rank all-reduce of n bytes is at best one exchange of n).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// Round trips per size: about 64 MiB each way, between 20 and 2000.
pub(crate) fn iterations(bytes: usize) -> usize {
    ((64usize << 20) / bytes.max(1)).clamp(20, 2000)
}

/// Median round trip in microseconds for each of `sizes`, against an echoing child (`--tcp-echo-to`).
pub(crate) fn measure(exe: &std::path::Path, sizes: &[usize]) -> Result<Vec<(usize, f64)>> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding the ping-pong listener")?;
    let addr = listener.local_addr()?.to_string();
    let plan: Vec<String> = sizes
        .iter()
        .map(|b| format!("{b}x{}", iterations(*b) + warmup(*b)))
        .collect();
    let mut child = Command::new(exe)
        .arg("--tcp-echo-to")
        .arg(&addr)
        .arg("--echo-plan")
        .arg(plan.join(","))
        .spawn()
        .context("spawning the ping-pong echo")?;
    let (mut stream, _) = listener.accept().context("accepting the ping-pong echo")?;
    stream.set_nodelay(true)?;
    let mut out = Vec::new();
    for &bytes in sizes {
        let send = vec![7u8; bytes];
        let mut back = vec![0u8; bytes];
        let mut rtts = Vec::with_capacity(iterations(bytes));
        for i in 0..warmup(bytes) + iterations(bytes) {
            let start = Instant::now();
            stream.write_all(&send)?;
            stream.read_exact(&mut back)?;
            if i >= warmup(bytes) {
                rtts.push(start.elapsed().as_secs_f64() * 1e6);
            }
        }
        if back != send {
            bail!("the ping-pong echo returned other bytes than it was sent");
        }
        rtts.sort_by(f64::total_cmp);
        out.push((bytes, rtts[rtts.len() / 2]));
    }
    child.wait()?;
    Ok(out)
}

fn warmup(bytes: usize) -> usize {
    iterations(bytes) / 10 + 1
}

/// The child's side: for each `<bytes>x<count>` of `plan`, echo `count` messages of `bytes`.
pub(crate) fn echo(addr: &str, plan: &str) -> Result<()> {
    let mut stream = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    stream.set_nodelay(true)?;
    for step in plan.split(',').filter(|s| !s.is_empty()) {
        let (bytes, count) = step
            .split_once('x')
            .and_then(|(b, c)| Some((b.parse::<usize>().ok()?, c.parse::<usize>().ok()?)))
            .with_context(|| format!("--echo-plan: {step:?} is not <bytes>x<count>"))?;
        let mut buf = vec![0u8; bytes];
        for _ in 0..count {
            stream.read_exact(&mut buf)?;
            stream.write_all(&buf)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_messages_get_many_round_trips_and_large_ones_few() {
        assert_eq!(iterations(4096), 2000);
        assert_eq!(iterations(1 << 20), 64);
        assert_eq!(iterations(64 << 20), 20);
    }
}
