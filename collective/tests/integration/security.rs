//! Every call needs the job token; rendezvous and collective refuse other jobs, generations,
//! world sizes and duplicate ranks with clear gRPC codes.

use crate::common;

use std::time::Duration;

use crate::common::{GENERATION, JOB, TOKEN, config, rendezvous_listener, world};
use rdu_collective::proto::collective_client::CollectiveClient;
use rdu_collective::proto::rendezvous_client::RendezvousClient;
use rdu_collective::proto::{AbortRequest, Chunk, JoinRequest};
use rdu_collective::{CollectiveError, Communicator, FROM_RANK, GENERATION as GENERATION_KEY};
use tonic::Code;
use tonic::transport::Channel;

const TIMEOUT: Duration = Duration::from_secs(5);

/// The servers are listening before this is called (their listeners are bound).
async fn channel(address: &str) -> Channel {
    Channel::from_shared(format!("http://{address}"))
        .expect("uri")
        .connect()
        .await
        .expect("server is listening")
}

fn join_request(rank: u32) -> JoinRequest {
    JoinRequest {
        job_uid: JOB.into(),
        generation: GENERATION,
        rank,
        world_size: 2,
        address: format!("127.0.0.1:{}", 1000 + rank),
        node: "n".into(),
        chunk_bytes: common::CHUNK_BYTES as u64,
    }
}

fn with_token<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    if let Some(t) = token {
        r.metadata_mut().insert(
            "authorization",
            format!("Bearer {t}").parse().expect("ascii"),
        );
    }
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rendezvous_refuses_bad_joins_then_still_completes() {
    let (listener, port) = rendezvous_listener().await;
    let rank0 = tokio::spawn(Communicator::connect_with_rendezvous_listener(
        config(0, 2, port, "n", TIMEOUT),
        listener,
    ));
    let mut client = RendezvousClient::new(channel(&format!("127.0.0.1:{port}")).await);

    let cases: Vec<(Code, JoinRequest, Option<&str>)> = vec![
        (Code::Unauthenticated, join_request(1), None),
        (Code::Unauthenticated, join_request(1), Some("wrong")),
        (
            Code::PermissionDenied,
            JoinRequest {
                job_uid: "other".into(),
                ..join_request(1)
            },
            Some(TOKEN),
        ),
        (
            Code::FailedPrecondition,
            JoinRequest {
                generation: GENERATION + 1,
                ..join_request(1)
            },
            Some(TOKEN),
        ),
        (
            Code::FailedPrecondition,
            JoinRequest {
                world_size: 3,
                ..join_request(1)
            },
            Some(TOKEN),
        ),
        (
            Code::InvalidArgument,
            JoinRequest {
                rank: 2,
                ..join_request(1)
            },
            Some(TOKEN),
        ),
    ];
    for (code, request, token) in cases {
        let status = client
            .join(with_token(request.clone(), token))
            .await
            .expect_err("must refuse");
        assert_eq!(status.code(), code, "{request:?} token {token:?}: {status}");
    }

    // A Communicator with the wrong token gets a clear, non-retryable error.
    let mut bad = config(1, 2, port, "n", TIMEOUT);
    bad.identity.token = "wrong".into();
    match Communicator::connect(bad).await {
        Err(
            e @ CollectiveError::RendezvousRefused {
                code: Code::Unauthenticated,
                ..
            },
        ) => {
            assert!(!e.is_retryable())
        }
        Err(e) => panic!("expected Unauthenticated refusal, got {e}"),
        Ok(_) => panic!("joined with a wrong token"),
    }

    // A correct rank 1 completes the rendezvous (the table was not polluted by refusals)...
    let table = client
        .join(with_token(join_request(1), Some(TOKEN)))
        .await
        .expect("join rank 1")
        .into_inner();
    assert_eq!(
        table.peers.iter().map(|p| p.rank).collect::<Vec<_>>(),
        vec![0, 1]
    );
    // ...after which rank 1 is a duplicate.
    let status = client
        .join(with_token(join_request(1), Some(TOKEN)))
        .await
        .expect_err("duplicate");
    assert_eq!(status.code(), Code::AlreadyExists);
    rank0.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collective_calls_need_the_token_and_the_generation() {
    let comms = world(2, |_| "n".into(), TIMEOUT).await;
    let address = comms[1].peers()[1].address.clone();
    let mut client = CollectiveClient::new(channel(&address).await);

    let abort = AbortRequest {
        generation: GENERATION,
        from_rank: 0,
        reason: "x".into(),
        permanent: false,
    };
    let status = client
        .abort(with_token(abort.clone(), None))
        .await
        .expect_err("no token");
    assert_eq!(status.code(), Code::Unauthenticated);
    let status = client
        .abort(with_token(abort.clone(), Some("wrong")))
        .await
        .expect_err("bad token");
    assert_eq!(status.code(), Code::Unauthenticated);
    let stale = AbortRequest {
        generation: GENERATION - 1,
        ..abort
    };
    let status = client
        .abort(with_token(stale, Some(TOKEN)))
        .await
        .expect_err("stale");
    assert_eq!(status.code(), Code::FailedPrecondition);

    // A stream of another generation is refused before any chunk is read.
    let chunk = Chunk {
        generation: GENERATION - 1,
        ..Chunk::default()
    };
    let mut request = with_token(tokio_stream::iter(vec![chunk]), Some(TOKEN));
    request.metadata_mut().insert(FROM_RANK, 0u32.into());
    request
        .metadata_mut()
        .insert(GENERATION_KEY, (GENERATION - 1).into());
    let status = client.send(request).await.expect_err("stale stream");
    assert_eq!(status.code(), Code::FailedPrecondition);

    // A second stream from a rank that already streams is refused (rank 0 opens its stream to
    // rank 1 the first time it sends to it: in this barrier).
    let results = futures::future::join_all(comms.iter().map(Communicator::barrier)).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(comms[0].linked_peers(), [1]);
    let mut request = with_token(tokio_stream::iter(Vec::<Chunk>::new()), Some(TOKEN));
    request.metadata_mut().insert(FROM_RANK, 0u32.into());
    request
        .metadata_mut()
        .insert(GENERATION_KEY, GENERATION.into());
    let status = client.send(request).await.expect_err("duplicate stream");
    assert_eq!(status.code(), Code::AlreadyExists);

    // None of this disturbed the job.
    let results = futures::future::join_all(comms.iter().map(Communicator::barrier)).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
}
