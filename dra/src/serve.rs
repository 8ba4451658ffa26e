//! Running the plugin: the DRAPlugin service on its socket, then the registration service (the kubelet dials the
//! former once the latter answered), and the node's ResourceSlices applied at start, after every registration
//! (the kubelet deletes a node's slices when it starts and after a driver unregisters) and every resync period.
//! Both sockets relay through [`crate::authority`], since the kubelet names a socket's path as its authority. On
//! shutdown both sockets are removed, so the kubelet's plugin watcher unregisters the driver.

use crate::api::dra_plugin_server::DraPluginServer;
use crate::authority::listen_fixing_authority;
use crate::config::DraConfig;
use crate::driver::{ClaimSource, Driver, DriverConfig, DriverError};
use crate::publish::{PublishError, publish};
use crate::registration::{Registrar, RegistrationError, RegistrationState};
use crate::registration_api::registration_server::RegistrationServer;
use crate::socket::SocketError;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;
use tonic::transport::Server;

/// How long a failed publish waits before the next try.
const PUBLISH_RETRY: Duration = Duration::from_secs(5);

/// Errors starting or running the plugin.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot start the DRAPlugin service")]
    Driver(#[source] DriverError),
    #[error("cannot set up registration")]
    Registration(#[source] RegistrationError),
    #[error("cannot listen for the kubelet")]
    Socket(#[source] SocketError),
    #[error("the {service} gRPC server failed")]
    Server {
        service: &'static str,
        #[source]
        source: tonic::transport::Error,
    },
}

/// Why the node's slices are applied now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishCause {
    Start,
    Registered,
    Resync,
    Retry,
}

/// What the publish loop does after an outcome: the next wait before a resync or a retry.
pub fn next_wait(published: bool, resync: Duration) -> (Duration, PublishCause) {
    if published {
        (resync, PublishCause::Resync)
    } else {
        (PUBLISH_RETRY.min(resync), PublishCause::Retry)
    }
}

/// The pool generation of this run: seconds since the epoch, so a restarted plugin (whose topology may differ)
/// publishes a newer generation than the one before it.
pub fn pool_generation(now: SystemTime) -> i64 {
    now.duration_since(UNIX_EPOCH)
        .map_or(1, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .max(1)
}

/// Runs the plugin of `config.node_name` until `shutdown` resolves.
pub async fn run(
    config: DraConfig,
    client: kube::Client,
    claims: Arc<dyn ClaimSource>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let driver = Driver::new(
        DriverConfig {
            node_name: config.node_name.clone(),
            topology: config.topology,
            cdi_dir: config.cdi_dir.clone(),
            checkpoint_path: config.checkpoint_file.clone(),
            domain_dir: config.shm_domain_dir.clone(),
        },
        claims,
    )
    .map_err(ServeError::Driver)?;
    let (stop, stopped) = watch::channel(false);
    let until_stopped = |mut stopped: watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|s| *s).await;
    };

    let plugin_incoming =
        listen_fixing_authority(&config.plugin_socket).map_err(ServeError::Socket)?;
    let plugin_server = tokio::spawn(
        Server::builder()
            .add_service(DraPluginServer::new(driver))
            .serve_with_incoming_shutdown(plugin_incoming, until_stopped(stopped.clone())),
    );
    let registrar =
        Arc::new(Registrar::new(&config.plugin_socket).map_err(ServeError::Registration)?);
    let registration = registrar.subscribe();
    let registration_incoming =
        listen_fixing_authority(&config.registration_socket).map_err(ServeError::Socket)?;
    let registration_server = tokio::spawn(
        Server::builder()
            .add_service(RegistrationServer::from_arc(registrar))
            .serve_with_incoming_shutdown(registration_incoming, until_stopped(stopped.clone())),
    );
    tracing::info!(
        node = %config.node_name,
        plugin_socket = %config.plugin_socket.display(),
        registration_socket = %config.registration_socket.display(),
        tiles = config.topology.total_tiles(),
        "serving the kubelet"
    );

    tokio::select! {
        () = publish_loop(&config, client, registration) => {}
        () = shutdown => tracing::info!("stopping"),
    }
    let _ = stop.send(true);
    // Registration socket first: the kubelet unregisters the driver before its DRAPlugin socket goes.
    remove_socket(&config.registration_socket);
    let registration_result = registration_server.await;
    remove_socket(&config.plugin_socket);
    let plugin_result = plugin_server.await;
    for (service, result) in [
        ("registration", registration_result),
        ("DRAPlugin", plugin_result),
    ] {
        match result {
            Ok(Ok(())) => {}
            Ok(Err(source)) => return Err(ServeError::Server { service, source }),
            Err(join) => tracing::error!(service, error = %join, "server task ended abnormally"),
        }
    }
    Ok(())
}

/// Applies the node's slices at start, after every registration and every resync period; never returns.
async fn publish_loop(
    config: &DraConfig,
    client: kube::Client,
    mut registration: watch::Receiver<RegistrationState>,
) {
    let generation = pool_generation(SystemTime::now());
    let mut cause = PublishCause::Start;
    loop {
        let published = match publish(
            client.clone(),
            &config.node_name,
            &config.topology,
            &config.model,
            generation,
        )
        .await
        {
            Ok(slices) => {
                let log = cause != PublishCause::Resync;
                if log {
                    tracing::info!(node = %config.node_name, ?cause, slices = slices.len(), generation, "published the node's ResourceSlices");
                }
                true
            }
            Err(e) => {
                log_publish_error(&config.node_name, cause, &e);
                false
            }
        };
        let (wait, after) = next_wait(published, config.resync);
        cause = next_cause(&mut registration, wait, after).await;
    }
}

/// Waits `wait` and answers `after`, unless the kubelet registers the driver first: then `Registered` at once.
/// A refusal (logged by the registrar) does not end the wait.
async fn next_cause(
    registration: &mut watch::Receiver<RegistrationState>,
    wait: Duration,
    after: PublishCause,
) -> PublishCause {
    let deadline = tokio::time::sleep(wait);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            () = &mut deadline => return after,
            changed = registration.changed() => {
                if changed.is_err() {
                    // The registrar is gone (only at shutdown): just wait out the deadline.
                    deadline.as_mut().await;
                    return after;
                }
                if *registration.borrow_and_update() == RegistrationState::Registered {
                    return PublishCause::Registered;
                }
            }
        }
    }
}

fn log_publish_error(node: &str, cause: PublishCause, error: &PublishError) {
    tracing::warn!(node, ?cause, error = %rdu_error_chain::chain(error), "cannot publish the node's ResourceSlices; retrying");
}

fn remove_socket(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %rdu_error_chain::chain(&e), "cannot remove socket")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_publish_is_retried_sooner_than_a_resync() {
        let resync = Duration::from_secs(30);
        assert_eq!(next_wait(true, resync), (resync, PublishCause::Resync));
        assert_eq!(
            next_wait(false, resync),
            (Duration::from_secs(5), PublishCause::Retry)
        );
        let fast = Duration::from_secs(1);
        assert_eq!(next_wait(false, fast), (fast, PublishCause::Retry));
    }

    #[tokio::test]
    async fn a_registration_cuts_the_wait_short_and_a_refusal_does_not() {
        let (tx, mut rx) = watch::channel(RegistrationState::Pending);
        let long = Duration::from_secs(3600);
        tx.send_replace(RegistrationState::Registered);
        assert_eq!(
            next_cause(&mut rx, long, PublishCause::Resync).await,
            PublishCause::Registered
        );
        // The kubelet registering again (after its restart) is a change too, though the state is the same.
        tx.send_replace(RegistrationState::Registered);
        assert_eq!(
            next_cause(&mut rx, long, PublishCause::Resync).await,
            PublishCause::Registered
        );
        tx.send_replace(RegistrationState::Refused("version".into()));
        assert_eq!(
            next_cause(&mut rx, Duration::from_millis(20), PublishCause::Retry).await,
            PublishCause::Retry
        );
        drop(tx);
        assert_eq!(
            next_cause(&mut rx, Duration::from_millis(20), PublishCause::Resync).await,
            PublishCause::Resync
        );
    }

    #[test]
    fn each_run_publishes_a_newer_generation_than_the_one_before() {
        let earlier = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let later = earlier + Duration::from_secs(3);
        assert!(pool_generation(later) > pool_generation(earlier));
        assert_eq!(pool_generation(earlier), 1_700_000_000);
        assert_eq!(pool_generation(UNIX_EPOCH), 1);
        assert_eq!(pool_generation(UNIX_EPOCH - Duration::from_secs(5)), 1);
    }
}
