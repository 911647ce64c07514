//! The drainer: runs inside a drain pod and moves the drained ordinal's data to the remaining
//! pods of its StatefulSet, either itself ([`redistribute`]) or by running the user's command
//! ([`hook`]).
//!
//! Exit codes follow [`drain_api::exit_codes`]: `0` when the drain is done (the controller then
//! deletes the claims), [`FAILURE`](drain_api::exit_codes::FAILURE) when it failed (nothing
//! unacknowledged was deleted; the controller retries the pod), or the hook's own code.

pub mod claim_mount;
pub mod cli;
pub mod group;
pub mod hook;
pub mod peers;
pub mod placement;
pub mod reaper;
pub mod rebalance;
pub mod redistribute;

use cli::{Args, Command, DrainContext, ExecArgs, PeerArgs, RebalanceArgs, RedistributeArgs};
use peers::{Addressing, KubePeers, Target};

/// Errors that end the drainer with [`FAILURE`](drain_api::exit_codes::FAILURE).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A context value the mode needs is not set.
    #[error("missing --{flag} (environment variable {env})")]
    MissingContext {
        /// The flag.
        flag: &'static str,
        /// Its environment variable.
        env: &'static str,
    },
    /// Hook mode discovers peers, but a context value discovery needs is not set; the hook was
    /// not run.
    #[error(
        "missing --{flag} (environment variable {env}) to discover the hook's peers, so the hook \
         was not run (pass --no-peers if it does not need peers)"
    )]
    MissingPeerContext {
        /// The flag.
        flag: &'static str,
        /// Its environment variable.
        env: &'static str,
    },
    /// The data directory is not the drained claim as the set's pods mount it.
    #[error("the data directory is not the drained claim")]
    ClaimMount(#[from] claim_mount::MountError),
    /// The check that the data directory is the drained claim could not be made: the drain
    /// fails rather than trust a directory it cannot tie to the claim.
    #[error(
        "cannot prove that the data directory is the drained claim, so the drain fails and the \
         claim stays: missing {missing} (or pass --allow-unmounted-data-dir to skip the volume \
         checks, only if the claim is mounted above the data directory)"
    )]
    ClaimMountUnchecked {
        /// What is missing: the context, credentials, or which permission.
        missing: String,
    },
    /// The drain pod or its set could not be read to check the data directory.
    #[error("failed to read {what} to check that the data directory is the drained claim")]
    ReadForMountCheck {
        /// What (`pod ns/name`, `statefulset ns/name`).
        what: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The drain pod's set cannot be understood to check the data directory.
    #[error("failed to read the statefulset to check that the data directory is the drained claim")]
    SetForMountCheck(#[source] peers::PeersError),
    /// Built-in redistribution failed.
    #[error("redistribution failed")]
    Redistribute(#[from] redistribute::RedistributeError),
    /// Hook mode failed.
    #[error("hook failed")]
    Hook(#[from] hook::HookError),
    /// Installing the signal handlers failed.
    #[error("failed to install signal handlers")]
    Signals(#[source] std::io::Error),
    /// The completion record handed to this container names a claim its drain does not drain:
    /// writing it would prove that claim drained. Checked before any data moves.
    #[error(
        "the completion record of this container names claims {named}, but it drains only {drained} \
         (at the data directory): it would prove the others drained. Mount in this container only \
         the claim it drains, and drain each other claim in a container of its own"
    )]
    RecordNamesUndrained {
        /// The claims the record names.
        named: String,
        /// The claim drained (or `one claim`, unchecked).
        drained: String,
    },
    /// The drain finished but its completion record could not be written.
    #[error("failed to write the completion record to {path}")]
    WriteCompletionRecord {
        /// The termination log's path.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// A short category for logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::ClaimMount(_) => "ClaimMount",
            Self::ClaimMountUnchecked { .. } => "ClaimMountUnchecked",
            Self::ReadForMountCheck { .. } | Self::SetForMountCheck(_) => "ReadForMountCheck",
            Self::MissingContext { .. } | Self::MissingPeerContext { .. } => "MissingContext",
            Self::Redistribute(e) => e.reason(),
            Self::Hook(e) => e.reason(),
            Self::Signals(_) => "Signals",
            Self::WriteCompletionRecord { .. } => "WriteCompletionRecord",
            Self::RecordNamesUndrained { .. } => "RecordNamesUndrained",
        }
    }
}

/// Runs the mode chosen by `args`; returns the exit code.
pub async fn run(args: Args) -> Result<i32, Error> {
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        statefulset = args.drain.statefulset.as_deref().unwrap_or(""),
        namespace = args.drain.namespace.as_deref().unwrap_or(""),
        ordinal = ?args.drain.ordinal,
        pod = args.drain.pod_name.as_deref().unwrap_or(""),
        "starting drainer"
    );
    match args.command {
        Command::Redistribute(options) => run_redistribute(&args.drain, options).await,
        Command::Exec(options) => run_exec(&args.drain, options).await,
        Command::Rebalance(options) => run_rebalance(&args.drain, options).await,
    }
}

async fn run_redistribute(drain: &DrainContext, args: RedistributeArgs) -> Result<i32, Error> {
    let source = KubePeers::new(target(drain, &args.peers)?);
    // The local check first (no API needed), then the drain pod's spec against the set's.
    redistribute::check_data_dir(&args.data_dir, args.allow_unmounted_data_dir)?;
    let drained = if args.allow_unmounted_data_dir {
        None
    } else {
        Some(verify_claim_mount(drain, &args.data_dir).await?.claim)
    };
    check_record_names_only(drain, drained.as_deref())?;
    let progress = if args.no_progress_annotation {
        None
    } else {
        progress_publisher(drain).await
    };
    let options = redistribute::Options {
        data_dir: args.data_dir,
        allow_unmounted: args.allow_unmounted_data_dir,
        concurrency: args.concurrency as usize,
        max_rate: args.limits.max_rate,
        max_bytes_per_second: args.limits.max_bytes_per_second,
        put_retries: args.put_retries as usize,
        put_retry_delay: args.put_retry_delay,
        max_rounds: args.max_rounds as usize,
        round_delay: args.round_delay,
        idle_timeout: args.idle_timeout,
        progress_interval: args.progress_interval,
        progress,
        leave_behind: args.leave_behind,
    };
    // On SIGTERM/SIGINT (the drain pod deleted, evicted, or its node drained) stop at once:
    // dropping the run cancels the PUTs in flight, and a file is deleted only after its PUT was
    // acknowledged, so every record not yet moved stays for the next drain pod to resume from.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(Error::Signals)?;
    let summary = tokio::select! {
        summary = redistribute::redistribute(&options, &source) => summary?,
        _ = term.recv() => return Ok(stopped("SIGTERM", 15)),
        _ = tokio::signal::ctrl_c() => return Ok(stopped("SIGINT", 2)),
    };
    tracing::info!(
        records = summary.records,
        bytes = summary.bytes,
        newer_there = summary.newer_there,
        skipped = ?summary.skipped,
        rounds = summary.rounds,
        "drain done"
    );
    record_completion(drain)?;
    Ok(drain_api::exit_codes::SUCCESS)
}

/// Fails unless the completion record handed to this container names no claim but `drained`,
/// the one claim this drain drains (`None`: not checked, under `--allow-unmounted-data-dir`;
/// then the record may name at most one claim). A template that mounts a second claim into a
/// container draining one directory cannot get that claim's undrained data deleted.
pub fn check_record_names_only(drain: &DrainContext, drained: Option<&str>) -> Result<(), Error> {
    let Some(record) = drain
        .completion_record
        .as_deref()
        .and_then(drain_api::completion::CompletionRecord::parse)
    else {
        return Ok(());
    };
    let fits = match drained {
        Some(claim) => record.claims.keys().all(|named| named == claim),
        None => record.claims.len() <= 1,
    };
    if fits {
        return Ok(());
    }
    Err(Error::RecordNamesUndrained {
        named: record.claims.keys().cloned().collect::<Vec<_>>().join(", "),
        drained: drained.map_or_else(|| "one directory".to_owned(), |c| format!("claim {c}")),
    })
}

/// After a finished drain, and only then: writes the completion record the controller handed
/// this pod to the termination log, the proof that the drain finished
/// ([`drain_api::completion`]). Without one (run outside a drain pod, or by an older
/// controller) nothing is written, and says so.
pub fn record_completion(drain: &DrainContext) -> Result<(), Error> {
    let Some(record) = drain.completion_record.as_deref().filter(|r| !r.is_empty()) else {
        tracing::warn!(
            env = drain_api::env::COMPLETION_RECORD,
            "no completion record to write: the controller will not take this drain as finished \
             unless its set uses the exit-code success proof"
        );
        return Ok(());
    };
    if drain_api::completion::CompletionRecord::parse(record).is_none() {
        tracing::warn!(
            record,
            "the completion record given is not one the controller reads; writing it as given"
        );
    }
    std::fs::write(&drain.termination_log, record).map_err(|source| {
        Error::WriteCompletionRecord {
            path: drain.termination_log.clone(),
            source,
        }
    })?;
    tracing::info!(path = %drain.termination_log.display(), "completion record written");
    Ok(())
}

/// Most bytes of a failure written to the termination message (the kubelet keeps 4 KiB).
pub const FAILURE_MESSAGE_BYTES: usize = 2048;

/// In a drain pod (the context names the pod), writes why the drain failed to the termination
/// message, so the controller's `DrainFailed` event and the set's status say it, not only the
/// pod's log (gone with the pod). Never a completion record: the controller reads one only
/// from a container that exited 0, and this text is none. Failing to write it is logged.
pub fn record_failure(drain: &DrainContext, error: &Error) {
    if drain.pod_name.is_none() {
        return;
    }
    let mut text = format!("drain failed: {}", error_chain(error));
    if text.len() > FAILURE_MESSAGE_BYTES {
        let mut cut = FAILURE_MESSAGE_BYTES - '…'.len_utf8();
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    if let Err(e) = std::fs::write(&drain.termination_log, text) {
        tracing::debug!(path = %drain.termination_log.display(), error = %e, "failure not written to the termination message");
    }
}

/// In a drain pod (the context names the pod, its set and namespace), checks with
/// [`claim_mount::check`] that the data directory is the drained claim mounted like the set's
/// pods mount it. Fails closed: a drain that cannot read its pod and its set (no context, no
/// credentials, RBAC denying `get` on either) cannot prove it looks at the claim's volume, so
/// it fails ([`Error::ClaimMountUnchecked`], naming what is missing) and the claim stays.
/// `--allow-unmounted-data-dir` is the one way to skip it. Other API errors fail the attempt
/// too (retried).
async fn verify_claim_mount(
    drain: &DrainContext,
    dir: &std::path::Path,
) -> Result<claim_mount::ClaimMount, Error> {
    let unchecked = |missing: String| Error::ClaimMountUnchecked { missing };
    let (Some(ns), Some(pod), Some(set)) = (&drain.namespace, &drain.pod_name, &drain.statefulset)
    else {
        return Err(unchecked(format!(
            "the drain context ({}, {} and {}, which the controller sets in every drain pod)",
            drain_api::env::POD_NAME,
            drain_api::env::STATEFULSET,
            drain_api::env::NAMESPACE
        )));
    };
    let client = kube::Client::try_default().await.map_err(|e| {
        unchecked(format!(
            "Kubernetes credentials ({}): the drain pod needs a service account token (do not set \
             automountServiceAccountToken: false in the drain template) with get on pods and \
             statefulsets",
            error_chain(&e)
        ))
    })?;
    let denied = |e: &kube::Error, what: &str| match e {
        kube::Error::Api(s) if s.code == 403 => Some(unchecked(format!(
            "permission to get {what} in namespace {ns} (403: {}): grant the drain pod's service \
             account get on {what}",
            s.message
        ))),
        kube::Error::Api(s) if s.code == 401 => Some(unchecked(format!(
            "valid credentials (401 reading {what}: {})",
            s.message
        ))),
        _ => None,
    };
    let read = |what: String| move |source| Error::ReadForMountCheck { what, source };
    let pod_obj = match kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), ns)
        .get(pod)
        .await
    {
        Err(e) => {
            return Err(denied(&e, "pods").unwrap_or_else(|| read(format!("pod {ns}/{pod}"))(e)));
        }
        Ok(pod_obj) => pod_obj,
    };
    let api_version = drain
        .statefulset_api_version
        .as_deref()
        .filter(|v| !v.is_empty())
        .unwrap_or(peers::STATEFULSET_API_VERSION);
    let set_obj = match peers::get_set(&client, ns, set, api_version).await {
        Err(peers::PeersError::GetStatefulSet { source, .. }) => {
            let what = format!("statefulsets ({api_version})");
            return Err(denied(&source, &what)
                .unwrap_or_else(|| read(format!("statefulset {ns}/{set}"))(source)));
        }
        Err(e) => return Err(Error::SetForMountCheck(e)),
        Ok((set_obj, _)) => set_obj,
    };
    let mount = claim_mount::check(&pod_obj, &set_obj, dir)?;
    tracing::info!(data_dir = %dir.display(), claim = %mount.claim, volume = %mount.volume, sub_path = ?mount.sub_path, "data directory is the drained claim");
    Ok(mount)
}

/// Publishes progress on this drain pod when the context names it and a client can be built.
async fn progress_publisher(drain: &DrainContext) -> Option<redistribute::PodAnnotator> {
    let (Some(ns), Some(pod)) = (&drain.namespace, &drain.pod_name) else {
        tracing::info!("no pod name or namespace in the drain context; progress is only logged");
        return None;
    };
    match kube::Client::try_default().await {
        Ok(client) => Some(redistribute::PodAnnotator::new(
            kube::Api::namespaced(client, ns),
            pod.clone(),
        )),
        Err(e) => {
            tracing::warn!(error = %error_chain(&e), "no kubernetes client; progress is only logged");
            None
        }
    }
}

/// Rebalance mode: a pass every `--interval` (or one) until SIGTERM/SIGINT. A pass that fails
/// is logged and tried again at the next interval; with `--interval 0` it fails the run. The
/// pod's own ordinal is `--ordinal`, or read from `--pod-name` (`<set>-<ordinal>`).
async fn run_rebalance(drain: &DrainContext, args: RebalanceArgs) -> Result<i32, Error> {
    let mut drain = drain.clone();
    if drain.ordinal.is_none()
        && let (Some(pod), Some(set)) = (&drain.pod_name, &drain.statefulset)
    {
        drain.ordinal = drain_api::names::parse_pod_name(pod, set);
    }
    let target = target(&drain, &args.peers)?;
    let own = target.drained_ordinal;
    let source = KubePeers::new(target);
    let local = match args.local_url {
        Some(url) => url,
        None => url::Url::parse(&format!("http://127.0.0.1:{}", args.peers.peer_port))
            .expect("a loopback URL with a port parses"),
    };
    let options = rebalance::Options {
        data_dir: args.data_dir,
        local,
        concurrency: args.concurrency as usize,
        max_rate: args.limits.max_rate,
        max_bytes_per_second: args.limits.max_bytes_per_second,
        idle_timeout: args.idle_timeout,
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(Error::Signals)?;
    loop {
        let pass = tokio::select! {
            pass = rebalance::rebalance_once(&options, own, &source) => pass,
            _ = term.recv() => return Ok(stopped("SIGTERM", 15)),
            _ = tokio::signal::ctrl_c() => return Ok(stopped("SIGINT", 2)),
        };
        match pass {
            Ok(pass) if pass.moved + pass.deferred + pass.recovered > 0 => {
                tracing::info!(
                    moved = pass.moved,
                    newer_there = pass.newer_there,
                    deferred = pass.deferred,
                    recovered = pass.recovered,
                    "rebalance pass"
                );
            }
            Ok(pass) => tracing::debug!(member = pass.member, "rebalance pass: nothing to move"),
            Err(e) if args.interval.is_zero() => return Err(e.into()),
            Err(e) => {
                tracing::warn!(reason = e.reason(), error = %error_chain(&e), "rebalance pass failed; trying again later");
            }
        }
        if args.interval.is_zero() {
            return Ok(drain_api::exit_codes::SUCCESS);
        }
        tokio::select! {
            () = tokio::time::sleep(args.interval) => {}
            _ = term.recv() => return Ok(0),
            _ = tokio::signal::ctrl_c() => return Ok(0),
        }
    }
}

/// Logs a stop by signal and returns the conventional exit code (128 + signal number).
fn stopped(signal: &str, number: i32) -> i32 {
    tracing::warn!(
        signal,
        "stopping the drain; records not yet acknowledged stay for the next attempt"
    );
    128 + number
}

/// Hook mode. Without `--no-peers` a missing drain context fails at once (it cannot appear
/// later, so retrying would only delay the failure); failed discoveries are retried by
/// [`hook::run`]. The drainer reaps the orphans the hook leaves ([`reaper`]).
async fn run_exec(drain: &DrainContext, args: ExecArgs) -> Result<i32, Error> {
    // A hook told to drain a directory that is not the claim would succeed on nothing.
    redistribute::check_data_dir(&args.data_dir, args.allow_unmounted_data_dir)?;
    if !args.allow_unmounted_data_dir {
        verify_claim_mount(drain, &args.data_dir).await?;
    }
    // The hook is the user's: it may drain every claim its container mounts, as its record says.
    let discovery = if args.no_peers {
        hook::Discovery::Disabled
    } else {
        let target = target(drain, &args.peers).map_err(|e| match e {
            Error::MissingContext { flag, env } => Error::MissingPeerContext { flag, env },
            other => other,
        })?;
        hook::Discovery::Source(KubePeers::new(target))
    };
    let mut env = drain.env_vars();
    env.push((
        hook::env::DATA_DIR.to_owned(),
        args.data_dir.to_string_lossy().into_owned(),
    ));
    let hook = hook::Hook {
        command: args.command,
        env,
        retry: hook::RetryPolicy {
            max_retries: args.max_retries as usize,
            base_delay: args.retry_base_delay,
            max_delay: args.retry_max_delay,
        },
        run_without_ready_peers: args.run_without_ready_peers,
        processes_timeout: args.processes_timeout,
    };
    let mut signals = hook::Signals::os()?;
    let running = reaper::ChildPid::default();
    let _reaper = reaper::Reaper::start(running.clone())
        .inspect_err(|e| {
            tracing::warn!(
                reason = e.reason(),
                error = %error_chain(e),
                "not reaping orphaned processes of the hook"
            );
        })
        .ok();
    let code = hook::run(&hook, &discovery, &mut signals, &running).await?;
    if code == drain_api::exit_codes::SUCCESS {
        record_completion(drain)?;
    }
    Ok(code)
}

/// The discovery target from the drain's context.
fn target(drain: &DrainContext, peers: &PeerArgs) -> Result<Target, Error> {
    let missing = |flag, env| Error::MissingContext { flag, env };
    use drain_api::env;
    let port = peers.peer_port;
    Ok(Target {
        namespace: drain
            .namespace
            .clone()
            .ok_or_else(|| missing("namespace", env::NAMESPACE))?,
        statefulset: drain
            .statefulset
            .clone()
            .ok_or_else(|| missing("statefulset", env::STATEFULSET))?,
        drained_ordinal: drain
            .ordinal
            .ok_or_else(|| missing("ordinal", env::ORDINAL))?,
        api_version: drain
            .statefulset_api_version
            .clone()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| peers::STATEFULSET_API_VERSION.to_owned()),
        addressing: match &peers.peer_dns_suffix {
            Some(suffix) if !suffix.is_empty() => Addressing::Dns {
                suffix: suffix.clone(),
                port,
            },
            _ => Addressing::PodIp { port },
        },
    })
}

pub use drain_logging::error_chain;
