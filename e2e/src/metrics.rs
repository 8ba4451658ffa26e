//! Reading Prometheus metrics in tests and benches: the operator's /metrics and /readyz over plain HTTP, the API
//! server's /metrics through a client, and the text format parsed into samples.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Errors reading an HTTP endpoint.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("GET http://{addr}{path}")]
    Io {
        addr: SocketAddr,
        path: String,
        source: std::io::Error,
    },
    #[error("GET http://{addr}{path}: not an HTTP response: {head}")]
    NotHttp {
        addr: SocketAddr,
        path: String,
        head: String,
    },
    #[error("GET /metrics from the API server")]
    Kube(#[from] kube::Error),
    #[error("GET /metrics from the API server")]
    Request(#[from] http::Error),
}

/// `GET http://<addr><path>` (HTTP/1.1, connection closed after): the status code and the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), MetricsError> {
    http_request(addr, None, "GET", path, &[], b"").await
}

/// `POST http://<addr><path>` with `headers` and `body`: the status code and the body.
pub async fn http_post(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(u16, String), MetricsError> {
    http_request(addr, None, "POST", path, headers, body).await
}

/// [`http_post`] from the local address `source` (a loopback address other than 127.0.0.1 stands for another
/// client, as another pod would be).
pub async fn http_post_from(
    source: IpAddr,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(u16, String), MetricsError> {
    http_request(addr, Some(source), "POST", path, headers, body).await
}

async fn http_request(
    addr: SocketAddr,
    source: Option<IpAddr>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(u16, String), MetricsError> {
    let io = |source| MetricsError::Io {
        addr,
        path: path.to_string(),
        source,
    };
    let mut stream = match source {
        None => tokio::net::TcpStream::connect(addr).await.map_err(io)?,
        Some(ip) => {
            let socket = tokio::net::TcpSocket::new_v4().map_err(io)?;
            socket.bind(SocketAddr::new(ip, 0)).map_err(io)?;
            socket.connect(addr).await.map_err(io)?
        }
    };
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if method != "GET" {
        request.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    let mut bytes = request.into_bytes();
    bytes.extend_from_slice(body);
    stream.write_all(&bytes).await.map_err(io)?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.map_err(io)?;
    let response = String::from_utf8_lossy(&response).into_owned();
    let not_http = || MetricsError::NotHttp {
        addr,
        path: path.to_string(),
        head: response.chars().take(80).collect(),
    };
    let (head, body) = response.split_once("\r\n\r\n").ok_or_else(not_http)?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(not_http)?;
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((code, body))
}

/// The body of a chunked HTTP/1.1 response.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// The operator's /metrics text.
pub async fn scrape(addr: SocketAddr) -> Result<String, MetricsError> {
    let (code, body) = http_get(addr, "/metrics").await?;
    if code == 200 {
        Ok(body)
    } else {
        Err(MetricsError::NotHttp {
            addr,
            path: "/metrics".into(),
            head: format!("status {code}: {body}"),
        })
    }
}

/// The API server's own /metrics (the client needs the `/metrics` non-resource permission: the admin has it).
pub async fn apiserver_metrics(client: &kube::Client) -> Result<String, MetricsError> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    Ok(client.request_text(request).await?)
}

/// One sample of the text format: `name{label="value",...} value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Every sample of a text-format page (comments and unparsable lines skipped).
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(parse_line)
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let (name, labels, rest) = match line.find('{') {
        Some(open) if line[..open].find(' ').is_none() => {
            let close = open + line[open..].find('}')?;
            (
                &line[..open],
                parse_labels(&line[open + 1..close])?,
                &line[close + 1..],
            )
        }
        _ => {
            let (name, rest) = line.split_once(' ')?;
            (name, BTreeMap::new(), rest)
        }
    };
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

fn parse_labels(text: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => {
                    let (_, escaped) = chars.next()?;
                    value.push(if escaped == 'n' { '\n' } else { escaped });
                }
                '"' => break i,
                c => value.push(c),
            }
        };
        labels.insert(key.trim_start_matches(',').trim().to_string(), value);
        rest = after[end + 1..].trim_start_matches(',');
    }
    Some(labels)
}

/// The sum of the samples named `name` whose labels include all of `labels` (0 when there is none).
pub fn sum(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 12
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="APPLY",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="rdu.dev",resource="rdujobs",scope="namespace",subresource="status",verb="APPLY",version="v1alpha1"} 4
rdu_operator_reconciles_total 7
rdu_operator_jobs{phase="Running"} 2
odd{help="a \"quoted\", value"} 1.5e3
"#;

    #[test]
    fn samples_are_parsed_with_their_labels() {
        let samples = parse(PAGE);
        assert_eq!(samples.len(), 6);
        assert_eq!(sum(&samples, "rdu_operator_reconciles_total", &[]), 7.0);
        assert_eq!(
            sum(&samples, "rdu_operator_jobs", &[("phase", "Running")]),
            2.0
        );
        assert_eq!(
            sum(&samples, "apiserver_request_total", &[("resource", "pods")]),
            15.0
        );
        assert_eq!(
            sum(&samples, "apiserver_request_total", &[("verb", "APPLY")]),
            7.0
        );
        assert_eq!(
            samples[5].labels.get("help").map(String::as_str),
            Some("a \"quoted\", value")
        );
        assert_eq!(samples[5].value, 1500.0);
        assert_eq!(sum(&samples, "absent", &[]), 0.0);
    }

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(
            dechunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            "hello world"
        );
    }
}
